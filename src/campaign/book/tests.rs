//! The book's same-bug rule on hand-made findings.

use super::*;

fn sig(trigger: &[Feature]) -> Signature {
    Signature {
        kernel: "k".into(),
        class: Class::Mismatch,
        reason: None,
        trigger: trigger.to_vec(),
    }
}

fn book_with(trigger: &[Feature], complete: bool) -> Book {
    let mut b = Book::default();
    let s = sig(trigger);
    let f = Finding {
        signature: s.key(),
        trigger_complete: complete,
        ..Default::default()
    };
    b.add(s, f);
    b
}

#[test]
fn a_bug_that_needs_nothing_does_not_absorb_one_that_needs_an_offset() {
    // Known: needs nothing. New: complete ablation says it needs KV offsets ≥ 2^32.
    let b = book_with(&[], true);
    assert_eq!(b.same_bug(&sig(&[Feature::KvOffset4g]), true), None);
    // Cut short, the new trigger proves nothing: the same bug.
    assert_eq!(
        b.same_bug(&sig(&[Feature::KvOffset4g]), false),
        Some((0, false))
    );
    // Known: needs the offset (complete). New: needs nothing: another bug.
    let b = book_with(&[Feature::KvOffset4g], true);
    assert_eq!(b.same_bug(&sig(&[]), true), None);
    let b = book_with(&[Feature::KvOffset4g], false);
    assert_eq!(b.same_bug(&sig(&[]), true), Some((0, true)));
    // A non-empty smaller trigger still generalises (the block size only looked needed).
    let b = book_with(&[Feature::KvOffset4g, Feature::BlockSize], true);
    assert_eq!(
        b.same_bug(&sig(&[Feature::KvOffset4g]), true),
        Some((0, true))
    );
}
