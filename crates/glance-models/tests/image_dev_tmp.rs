// TEMPORARY dev harness (reads /tmp/imgdev); deleted before hand-off.
use glance_models::processing::image::*;

#[test]
#[ignore]
fn dev_compare() {
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("/tmp/imgdev/cases.json").unwrap()).unwrap();
    let mut bad = 0;
    for c in cases["resize"].as_array().unwrap() {
        let g = |k: &str| c[k].as_u64().unwrap() as usize;
        let src = std::fs::read(c["src"].as_str().unwrap()).unwrap();
        let exp = std::fs::read(c["exp"].as_str().unwrap()).unwrap();
        let f = Filter::from_pil(c["filter"].as_i64().unwrap()).unwrap();
        let out = resize_u8(&src, g("w"), g("h"), g("c"), g("ow"), g("oh"), f).unwrap();
        let n = out.iter().zip(&exp).filter(|(a, b)| a != b).count();
        if n > 0 || out.len() != exp.len() {
            bad += 1;
            println!("RESIZE MISMATCH {c}: {n} of {}", exp.len());
        }
    }
    println!("resize cases bad: {bad}");
    for c in cases["pipeline"].as_array().unwrap() {
        let cfg = PreprocessorConfig::from_json(&c["config"]).unwrap();
        let proc = ImageProcessor::new(cfg).unwrap();
        let img = load_image(std::path::Path::new(c["image"].as_str().unwrap())).unwrap();
        let exp: Vec<f32> = std::fs::read(c["exp"].as_str().unwrap()).unwrap()
            .chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        match proc.preprocess(&img) {
            Ok(out) => {
                let shape: Vec<usize> = c["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                let (h, w) = proc.output_size_for(&img);
                let md = out.iter().zip(&exp).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let ndiff = out.iter().zip(&exp).filter(|(a, b)| a != b).count();
                if md > 0.0 || out.len() != exp.len() || shape != vec![3, h, w] {
                    println!("PIPE cfg{} {} {:?}: maxdiff {md} ndiff {ndiff}/{} len {} vs {} shape {:?} vs {:?}", c["cfg"], c["image"], img.color(), exp.len(), out.len(), exp.len(), shape, (h, w));
                }
            }
            Err(e) => println!("PIPE ERR cfg{} {}: {e}", c["cfg"], c["image"]),
        }
    }
}

#[test]
#[ignore]
fn dev_dump_jpeg() {
    let img = load_image(std::path::Path::new("/work/main/fixtures/images/chelsea.jpg")).unwrap();
    std::fs::write("/tmp/imgdev/chelsea_rs.raw", img.to_rgb8().into_raw()).unwrap();
    println!("{:?} {}x{}", img.color(), img.width(), img.height());
}

#[test]
#[ignore]
fn dev_time() {
    let (w, h) = (4000u32, 3000u32);
    let mut s = 12345u32;
    let buf: Vec<u8> = (0..w * h * 3).map(|_| { s ^= s << 13; s ^= s >> 17; s ^= s << 5; (s >> 24) as u8 }).collect();
    let img = image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, buf).unwrap());
    let mut cfg = PreprocessorConfig::default();
    cfg.size = ResizeTo::ShortestEdge(336);
    cfg.crop_size = CropSize { height: 336, width: 336 };
    let p = ImageProcessor::new(cfg).unwrap();
    for _ in 0..2 { p.preprocess(&img).unwrap(); }
    let t = std::time::Instant::now();
    let n = 5;
    for _ in 0..n { std::hint::black_box(p.preprocess(&img).unwrap()); }
    println!("4000x3000 -> 336: {:.1} ms", t.elapsed().as_secs_f64() * 1000.0 / n as f64);
    let imgp = image::DynamicImage::ImageRgb8(image::imageops::rotate90(img.as_rgb8().unwrap()));
    let t = std::time::Instant::now();
    for _ in 0..n { std::hint::black_box(p.preprocess(&imgp).unwrap()); }
    println!("3000x4000 -> 336: {:.1} ms", t.elapsed().as_secs_f64() * 1000.0 / n as f64);
    let t = std::time::Instant::now();
    for _ in 0..n { std::hint::black_box(resize_u8(img.as_rgb8().unwrap().as_raw(), 4000, 3000, 3, 448, 336, Filter::Bicubic).unwrap()); }
    println!("full resize 4000x3000 -> 448x336: {:.1} ms", t.elapsed().as_secs_f64() * 1000.0 / n as f64);
}
