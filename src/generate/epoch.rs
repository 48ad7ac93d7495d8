//! Shape epochs: libraries JIT-compile their kernel per shape (DeepGEMM per heads, head
//! dim and next_n; Triton per constexpr set), so a campaign that draws a new shape for
//! every case spends its time in the compiler. With a compile key declared
//! ([`crate::kernel::CompileField`]), cases run in epochs of `len` consecutive case
//! numbers that share the key's fields: each case is drawn as usual (lengths, tables,
//! offsets, values, everything else varies), then the key's fields are pinned to the
//! epoch's *leader*, a draw of its own seed. Production draws take their key from a
//! production leader and the others from a non-production one, so engine-shaped cases
//! keep an engine's shape. Every epoch draws a new leader, so over a campaign the key
//! fields reach the values they would reach anyway.

use super::Draw;
use crate::kernel::CompileField;

/// How cases are grouped into epochs.
#[derive(Clone, Debug, PartialEq)]
pub struct Epochs {
    /// Consecutive case numbers per epoch (at least 2; 1 would be no epochs).
    pub len: u64,
    /// The fields the kernels compile for (the union of their keys).
    pub fields: Vec<CompileField>,
}

impl Epochs {
    /// Epochs of `len` cases over `fields`; `None` when there is nothing to group
    /// (no compile key, or `len` ≤ 1).
    pub fn new(len: u64, mut fields: Vec<CompileField>) -> Option<Epochs> {
        fields.sort();
        fields.dedup();
        (len > 1 && !fields.is_empty()).then_some(Epochs { len, fields })
    }

    /// The epoch of case `k`.
    pub fn of(&self, k: u64) -> u64 {
        k / self.len
    }
}

/// Sets `draw`'s compile-key `fields` to `leader`'s.
pub fn pin(draw: &mut Draw, leader: &Draw, fields: &[CompileField]) {
    for f in fields {
        match f {
            CompileField::NextN => draw.knobs.next_n = leader.knobs.next_n,
            CompileField::Heads => draw.knobs.heads = leader.knobs.heads,
            CompileField::HeadDim => draw.knobs.head_dim = leader.knobs.head_dim,
            CompileField::BlockSize => draw.knobs.block_size = leader.knobs.block_size,
            CompileField::Layout => draw.shuffle16 = leader.shuffle16,
            CompileField::Format => draw.knobs.format = leader.knobs.format,
            CompileField::Lens2d => match (&draw.per_token, &leader.per_token) {
                (Some(_), None) => draw.per_token = None,
                (None, Some(p)) => draw.per_token = Some(p.clone()),
                _ => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::strategy::draw_strategy;
    use crate::generate::Profile;
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    #[test]
    fn pinning_copies_exactly_the_key_fields() {
        let mut runner = TestRunner::deterministic();
        let s = draw_strategy(Profile::Layout);
        let mut pick = || s.new_tree(&mut runner).unwrap().current();
        let leader = pick();
        let mut d = pick();
        while d.knobs.heads == leader.knobs.heads || d.knobs.seed == leader.knobs.seed {
            d = pick();
        }
        let before = d.clone();
        pin(&mut d, &leader, &[CompileField::Heads, CompileField::NextN]);
        assert_eq!(
            (d.knobs.heads, d.knobs.next_n),
            (leader.knobs.heads, leader.knobs.next_n)
        );
        assert_eq!(
            d.knobs.head_dim, before.knobs.head_dim,
            "other fields stay the case's own"
        );
        assert_eq!(d.lens, before.lens);
        assert_eq!(d.knobs.seed, before.knobs.seed);
    }

    #[test]
    fn no_key_or_length_one_means_no_epochs() {
        assert!(Epochs::new(64, vec![]).is_none());
        assert!(Epochs::new(1, vec![CompileField::Heads]).is_none());
        let e = Epochs::new(64, vec![CompileField::Heads, CompileField::Heads]).unwrap();
        assert_eq!(e.fields, vec![CompileField::Heads]);
        assert_eq!((e.of(63), e.of(64)), (0, 1));
    }
}
