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
//!
//! Production draws also run in *deployments* ([`pin_deployment`]): a server's model,
//! max_model_len, platform (format, block size, layout), MTP depth and KV pool (budget,
//! slab stride) are fixed when it starts, and what changes from one step to the next is
//! the batch, the churn and the occupancy. Consecutive production cases share their
//! deployment leader's, so they share a pool geometry, as the steps of one server do,
//! and a GPU worker keeps the pool it mapped and poisoned instead of redoing both per
//! case.

#[cfg(test)]
use super::strategy::LensDraw;
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
            // A batch comes with its lengths: not pinned, only reported.
            CompileField::BatchClass => {}
        }
    }
}

/// Gives a production `draw` its deployment `leader`'s server: model, max_model_len,
/// platform (fp8 format, block size, layout, 2-D lengths), MTP depth and KV pool
/// (budget, slab stride, bytes per token). Its own batch, churn, occupancy, table and
/// values stay. Its lengths are kept within the new max_model_len, and the request that
/// had run up to the old cap stays as far below the new one. A draw or leader without
/// an engine model is left alone.
pub fn pin_deployment(draw: &mut Draw, leader: &Draw) {
    let (Some(e), Some(l)) = (draw.engine.as_mut(), leader.engine.as_ref()) else {
        return;
    };
    let old_cap = e.max_model_len;
    e.model = l.model.clone();
    e.max_model_len = l.max_model_len;
    e.platform = l.platform;
    e.budget_bytes = l.budget_bytes;
    e.slab_stride_64 = l.slab_stride_64;
    e.pool_bytes_per_token = l.pool_bytes_per_token;
    draw.knobs.block_size = leader.knobs.block_size;
    draw.knobs.format = leader.knobs.format;
    draw.knobs.next_n = leader.knobs.next_n;
    draw.shuffle16 = leader.shuffle16;
    draw.per_token = leader.per_token.clone();
    let (cap, next_n, capped) = (e.max_model_len, draw.knobs.next_n, e.capped);
    if let super::strategy::LensDraw::Explicit(lens) = &mut draw.lens {
        for (i, l) in lens.iter_mut().enumerate() {
            if *l == 0 {
                continue;
            }
            let len = if capped == Some(i) {
                cap.saturating_sub(old_cap.saturating_sub(*l as usize))
            } else {
                *l as usize
            };
            *l = len.clamp(next_n, cap.max(next_n)) as u32;
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
    fn a_deployment_pins_the_server_and_keeps_the_batch() {
        let mut runner = TestRunner::deterministic();
        let s = draw_strategy(Profile::Production);
        let mut pick = || s.new_tree(&mut runner).unwrap().current();
        let leader = pick();
        let engine = |d: &Draw| d.engine.clone().unwrap();
        // A draw of another server whose batch has a request at its own cap.
        let mut d = pick();
        while engine(&d).max_model_len <= engine(&leader).max_model_len
            || engine(&d).capped.is_none()
        {
            d = pick();
        }
        let before = d.clone();
        pin_deployment(&mut d, &leader);
        let (e, l) = (engine(&d), engine(&leader));
        assert_eq!(
            (
                e.model.as_str(),
                e.max_model_len,
                e.platform,
                e.budget_bytes
            ),
            (
                l.model.as_str(),
                l.max_model_len,
                l.platform,
                l.budget_bytes
            )
        );
        assert_eq!(
            (e.slab_stride_64, e.pool_bytes_per_token),
            (l.slab_stride_64, l.pool_bytes_per_token)
        );
        assert_eq!(
            (
                d.knobs.block_size,
                d.knobs.format,
                d.knobs.next_n,
                d.shuffle16
            ),
            (
                leader.knobs.block_size,
                leader.knobs.format,
                leader.knobs.next_n,
                leader.shuffle16
            )
        );
        assert_eq!(d.per_token, leader.per_token);
        // The step's own traffic, churn and values stay.
        let b = engine(&before);
        assert_eq!(
            (e.traffic, e.churn, e.occupancy_pct),
            (b.traffic, b.churn, b.occupancy_pct)
        );
        assert_eq!(d.knobs.seed, before.knobs.seed);
        let (LensDraw::Explicit(lens), LensDraw::Explicit(old)) = (&d.lens, &before.lens) else {
            panic!("production draws have explicit lengths");
        };
        assert_eq!(lens.len(), old.len());
        let i = e.capped.unwrap();
        assert_eq!(
            l.max_model_len - lens[i] as usize,
            (b.max_model_len - old[i] as usize).min(l.max_model_len - d.knobs.next_n),
            "the capped request stays as far below the new cap"
        );
        for (&n, &o) in lens.iter().zip(old) {
            assert!(n as usize <= l.max_model_len);
            assert_eq!(n == 0, o == 0, "empty requests stay empty");
        }
        // A draw without an engine model (another profile's) is left alone.
        let mut dense = draw_strategy(Profile::Layout)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let copy = dense.clone();
        pin_deployment(&mut dense, &leader);
        assert_eq!(dense, copy);
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
