//! Splits never share a seed; names parse.

use std::collections::HashSet;

use glance_world::{Split, WorldError};

#[test]
fn splits_are_disjoint() {
    // By construction (see `split.rs`): seed = mix64(index << 2 | tag) with a bijective mix64.
    // Checked here on the first 5,000 indices of every split, plus some far-away ones.
    let mut all: HashSet<u64> = HashSet::new();
    let mut per: Vec<HashSet<u64>> = Vec::new();
    for s in Split::ALL {
        let mut set = HashSet::new();
        for i in (0..5000u64).chain([1 << 20, 1 << 40, (1 << 62) - 1]) {
            set.insert(s.seed(i).unwrap());
        }
        assert_eq!(set.len(), 5003);
        per.push(set);
    }
    for (a, sa) in per.iter().enumerate() {
        for sb in per.iter().skip(a + 1) {
            assert!(sa.is_disjoint(sb));
        }
        all.extend(sa);
    }
    assert_eq!(all.len(), 3 * 5003);
}

#[test]
fn split_names_parse() {
    assert_eq!("train".parse::<Split>().unwrap(), Split::Train);
    assert_eq!("Val".parse::<Split>().unwrap(), Split::Validation);
    assert_eq!(" test ".parse::<Split>().unwrap(), Split::Test);
    assert!(matches!(
        "tset".parse::<Split>(),
        Err(WorldError::UnknownName { .. })
    ));
    assert!(Split::Test.seed(u64::MAX).is_err());
    assert!(glance_world::sample(Split::Test, u64::MAX).is_err());
}
