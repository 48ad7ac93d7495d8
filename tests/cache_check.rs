//! How a run judged on the device proves that the kernel left its KV cache alone: a pool
//! of a GiB or more goes to the kernel read-only, so a store into it faults; such a
//! crash is run again with the cache writable, and the verdict names what the kernel
//! did (`input_mutated`), not how the mapping stopped it.

mod support;

use mqa_fuzz::case::Case;
use mqa_fuzz::generate::Recipe;
use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
use mqa_fuzz::kernel::{
    self, Capabilities, DeviceJudgeRequest, DeviceJudgement, JudgedRun, Kernel, OutputBuffer,
    RunError, RunInfo, READ_ONLY_MIN_BYTES,
};
use mqa_fuzz::oracle::{Class, OracleConfig, Verdict};
use std::sync::Mutex;

/// What the fake device kernel does with a writable cache.
#[derive(Clone, Copy)]
enum Writable {
    /// Stores into it (the read-back after the run sees it).
    Stores,
    /// Leaves it alone: it crashed only because the cache was read-only.
    LeavesAlone,
    /// Crashes too (a crash of its own, not a store).
    Crashes,
    /// Never answers, whatever the cache (a timeout, read-only or not).
    Hangs,
}

/// `cpu:chunked`'s output, judged "on the device" like a GPU worker's, from a kernel
/// that stores into its cache: a crash when the cache is read-only.
struct StoresIntoCache {
    inner: Box<dyn Kernel>,
    writable: Writable,
    /// `read_only_cache` of each request, in order.
    asked: Mutex<Vec<bool>>,
}

impl StoresIntoCache {
    fn new(writable: Writable) -> Self {
        StoresIntoCache {
            inner: kernel::open("cpu:chunked").unwrap(),
            writable,
            asked: Mutex::new(Vec::new()),
        }
    }
}

impl Kernel for StoresIntoCache {
    fn name(&self) -> &str {
        "test:stores-into-cache"
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn run(&self, case: &Case, out: &mut OutputBuffer) -> Result<RunInfo, RunError> {
        self.inner.run(case, out)
    }
    fn device_judge(&self) -> Result<(), String> {
        Ok(())
    }
    fn run_judged(
        &self,
        case: &Case,
        req: &DeviceJudgeRequest,
        out: &mut OutputBuffer,
    ) -> Result<JudgedRun, RunError> {
        self.asked.lock().unwrap().push(req.read_only_cache);
        if matches!(self.writable, Writable::Hangs) {
            return Err(RunError::Crash(format!(
                "no answer within 120 s {}",
                kernel::TIMEOUT_MARK
            )));
        }
        if req.read_only_cache {
            return Err(RunError::Crash(
                "CUDA fault: an illegal memory access was encountered".into(),
            ));
        }
        if matches!(self.writable, Writable::Crashes) {
            return Err(RunError::Crash(
                "CUDA fault: an illegal memory access".into(),
            ));
        }
        let info = self.inner.run(case, out)?;
        Ok(JudgedRun {
            info: RunInfo {
                inputs_intact: Some(matches!(self.writable, Writable::LeavesAlone)),
                ..info
            },
            // Clean counts; the output comes back, so the CPU judges it as always.
            judgement: DeviceJudgement::default(),
            output_written: true,
        })
    }
}

/// A small case whose pool is declared `num_blocks` long (only a few blocks are stored).
fn case_with_pool(num_blocks: u64) -> Case {
    let mut case = Recipe::small(vec![300, 0, 17, 64], 2, 7)
        .with(|k| {
            k.heads = 8;
            k.head_dim = 32;
        })
        .materialize();
    case.num_blocks = case.num_blocks.max(num_blocks);
    case.validate().expect("a valid case");
    case
}

fn judged(k: &StoresIntoCache, case: &Case) -> Verdict {
    judged_with(k, case, &OracleConfig::default())
}

fn judged_with(k: &StoresIntoCache, case: &Case, cfg: &OracleConfig) -> Verdict {
    let mut refs = ReferenceCache::new(case);
    run_and_judge(k, case, &mut refs, cfg).verdict
}

fn big_pool() -> Case {
    let case = case_with_pool(1);
    let blocks = READ_ONLY_MIN_BYTES.div_ceil(case.kv_block_stride);
    let case = case_with_pool(blocks);
    assert!(case.kv_cache_bytes() >= READ_ONLY_MIN_BYTES);
    case
}

#[test]
fn a_store_into_a_read_only_cache_is_run_again_writable_and_named_input_mutated() {
    let k = StoresIntoCache::new(Writable::Stores);
    let v = judged(&k, &big_pool());
    assert_eq!(*k.asked.lock().unwrap(), vec![true, false]);
    assert!(
        v.classes.contains_key(&Class::InputMutated),
        "{:?}",
        v.classes
    );
    assert!(!v.classes.contains_key(&Class::Crash), "{:?}", v.classes);
}

#[test]
fn a_crash_only_with_the_cache_read_only_stays_a_crash_and_says_so() {
    let k = StoresIntoCache::new(Writable::LeavesAlone);
    let v = judged(&k, &big_pool());
    assert_eq!(*k.asked.lock().unwrap(), vec![true, false]);
    assert_eq!(
        v.classes.keys().copied().collect::<Vec<_>>(),
        vec![Class::Crash]
    );
    let said = format!("{:?}", v.examples);
    assert!(said.contains("read-only"), "{said}");
}

#[test]
fn a_small_pool_is_handed_over_writable_and_read_back() {
    let k = StoresIntoCache::new(Writable::Stores);
    let case = case_with_pool(1);
    assert!(case.kv_cache_bytes() < READ_ONLY_MIN_BYTES);
    let v = judged(&k, &case);
    assert_eq!(*k.asked.lock().unwrap(), vec![false], "one run, writable");
    assert!(
        v.classes.contains_key(&Class::InputMutated),
        "{:?}",
        v.classes
    );
}

#[test]
fn a_kernel_that_keeps_crashing_gets_its_cache_read_back_instead() {
    let k = StoresIntoCache::new(Writable::Crashes);
    let case = big_pool();
    let cfg = OracleConfig::default();
    for _ in 0..12 {
        let v = judged_with(&k, &case, &cfg);
        assert_eq!(
            v.classes.keys().copied().collect::<Vec<_>>(),
            vec![Class::Crash]
        );
    }
    let asked = k.asked.lock().unwrap().clone();
    // Nine crashes under a read-only cache, each run again writable; then writable only.
    let read_only = asked.iter().filter(|&&ro| ro).count();
    assert_eq!(read_only, 9, "{asked:?}");
    assert_eq!(asked.len(), 9 * 2 + 3, "{asked:?}");
    assert!(asked[18..].iter().all(|&ro| !ro), "{asked:?}");
}

#[test]
fn a_hang_under_a_read_only_cache_is_not_run_again() {
    let k = StoresIntoCache::new(Writable::Hangs);
    let v = judged(&k, &big_pool());
    assert_eq!(*k.asked.lock().unwrap(), vec![true], "one run, no second");
    assert_eq!(
        v.classes.keys().copied().collect::<Vec<_>>(),
        vec![Class::Crash]
    );
}
