use mqa_fuzz::generate::*;
use mqa_fuzz::harness::judge_once;
use mqa_fuzz::kernel;
use mqa_fuzz::oracle::Class;

pub fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe::small(lens, next_n, 7)
}

#[test]
fn chunked_is_clean_and_tail_bug_is_caught() {
    let case = recipe(vec![300, 0, 17, 512], 2).materialize();
    case.validate().unwrap();
    for name in ["cpu:chunked", "cpu:naive"] {
        let k = kernel::open(name).unwrap();
        let v = judge_once(k.as_ref(), &case);
        assert!(v.is_clean(), "{name}: {v:?}");
        assert!(v.metrics.checked > 0);
    }
    let k = kernel::open("cpu:bug-tail-unwritten").unwrap();
    let v = judge_once(k.as_ref(), &case);
    assert!(v.classes.contains_key(&Class::Unwritten), "{v:?}");
}
