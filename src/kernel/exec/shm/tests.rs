use super::*;

#[test]
fn a_region_opened_by_path_sees_the_creators_bytes_and_grows() {
    let mut a = SharedRegion::create("mqa-fuzz-test").unwrap();
    a.ensure(100).unwrap();
    assert_eq!(a.len(), GROW_STEP);
    a.bytes_mut()[..4].copy_from_slice(&[1, 2, 3, 4]);
    let mut b = SharedRegion::open(a.path(), 100).unwrap();
    assert_eq!(&b.bytes()[..4], &[1, 2, 3, 4]);
    b.bytes_mut()[4] = 9;
    assert_eq!(a.bytes()[4], 9, "writes of the other side are seen");
    a.ensure(GROW_STEP + 1).unwrap();
    assert_eq!(a.len(), 2 * GROW_STEP);
    assert_eq!(&a.bytes()[..5], &[1, 2, 3, 4, 9], "growing keeps the bytes");
    assert!(SharedRegion::open(a.path(), 3 * GROW_STEP).is_err());
}

/// A worker keeps a mapping per region path. A region the pool lets go of must not
/// leave its path to a new region: here a worker-side mapping of every path handed
/// out is kept, and each later region under that path must show its own bytes
/// through it (before the fix, a region dropped past `keep` closed its fd, the next
/// region got the same `/proc/<pid>/fd/<n>` and the worker read the old pages).
#[test]
fn a_path_the_pool_hands_out_is_always_the_same_region() {
    let pool = RegionPool::new(1);
    let mut worker_maps: Vec<SharedRegion> = Vec::new();
    for round in 0u8..6 {
        // Three regions at once, more than `keep`: two are let go of at the end.
        let mut held: Vec<SharedRegion> = (0..3).map(|_| pool.take(4096).unwrap()).collect();
        for (i, r) in held.iter_mut().enumerate() {
            let mark = round * 10 + i as u8 + 1;
            r.bytes_mut()[0] = mark;
            let seen = match worker_maps.iter().find(|m| m.path() == r.path()) {
                Some(m) => m.bytes()[0],
                None => {
                    let m = SharedRegion::open(r.path(), 4096).unwrap();
                    let b = m.bytes()[0];
                    worker_maps.push(m);
                    b
                }
            };
            assert_eq!(
                seen,
                mark,
                "round {round}: the worker's mapping of {} shows another region",
                r.path()
            );
        }
        // An unrelated file opened meanwhile takes whatever fd number is free.
        let _other = std::fs::File::open("/proc/self/status").unwrap();
        for r in held {
            pool.give(r);
        }
    }
}

#[test]
fn a_large_region_shrinks_for_a_small_case() {
    let mut a = SharedRegion::create("mqa-fuzz-test").unwrap();
    a.ensure(SHRINK_ABOVE + 1).unwrap();
    let big = a.len();
    a.ensure(10).unwrap();
    assert!(a.len() < big / 4, "{} of {big}", a.len());
    a.ensure(GROW_STEP - 1).unwrap();
    assert_eq!(a.len(), GROW_STEP);
}

#[test]
fn layout_aligns_and_checks_bounds() {
    let q = [1u8, 2, 3];
    let w = [1.0f32, 2.0];
    let t = [
        ("q", vec![3], Data::Bytes(&q)),
        ("w", vec![2], Data::F32(&w)),
    ];
    let l = ShmTensors::layout("p".into(), &t);
    assert_eq!(l.tensors["q"].offset, 0);
    assert_eq!(l.tensors["w"].offset, 64);
    assert_eq!(l.bytes, 128);
    assert!(l.get("w", Dtype::F32, 128).is_ok());
    assert!(l.get("w", Dtype::F32, 70).unwrap_err().contains("past"));
    assert!(l.get("w", Dtype::U8, 128).unwrap_err().contains("F32"));
    assert!(l
        .get("x", Dtype::U8, 128)
        .unwrap_err()
        .contains("no tensor"));
}
