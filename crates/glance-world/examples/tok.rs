fn main() {
    glance_world::tokenizer::write_tokenizer_files(std::path::Path::new("/tmp/tok")).unwrap();
    glance_world::write_sample(glance_world::Split::Test, 16, std::path::Path::new("/tmp/ws")).unwrap();
}
