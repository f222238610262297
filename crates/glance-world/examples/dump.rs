use std::collections::BTreeMap;
use glance_world::*;
fn main() {
    let mut words: BTreeMap<String, usize> = BTreeMap::new();
    let mut add = |t: &str| {
        let mut cur = String::new();
        for c in t.to_lowercase().chars() {
            if c.is_alphanumeric() { cur.push(c) } else {
                if !cur.is_empty() { *words.entry(std::mem::take(&mut cur)).or_default() += 1; }
                if !c.is_whitespace() { *words.entry(c.to_string()).or_default() += 1; }
            }
        }
        if !cur.is_empty() { *words.entry(cur).or_default() += 1; }
    };
    for i in 0..20000 {
        let ex = sample(Split::Train, i).unwrap();
        for q in ex.questions.iter().chain(ex.dialogue.turns.iter()) {
            add(&q.question); add(&q.answer);
        }
        if i < 12 {
            ex.image.save(format!("/tmp/world_{i}.png")).unwrap();
            println!("--- {i} {:?}", ex.scene.sign);
            for q in ex.questions.iter() { println!("[{}] {} => {}", q.family, q.question, q.answer); }
            for q in ex.dialogue.turns.iter() { println!("  D[{}{}] {} => {}", q.family, if q.follow_up {"*"} else {""}, q.question, q.answer); }
        }
    }
    let list: Vec<String> = words.iter().filter(|(w, _)| !w.chars().all(|c| c.is_ascii_digit())).map(|(w, n)| format!("{w}:{n}")).collect();
    println!("{} words\n{}", list.len(), list.join(" "));
}
