//! Judging where the output lies (DESIGN §8): what the harness asks a kernel that runs
//! on a GPU worker ([`DeviceJudgeRequest`]) and what comes back ([`DeviceJudgement`]):
//! the exact GPU reference and the oracle's per-element rules applied on the device,
//! next to the kernel's output, and only counts, maxima, sums, one digest per row and
//! the sampled elements the CPU re-checks travel. The judge's rules are the oracle's
//! (`crate::oracle`); this module only holds the plain data both sides exchange.

use crate::case::{Case, ScalePlacement, Shape};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Why the exact GPU reference (`kernels/reference.cu`), and so the device judge,
/// cannot take a shape: its MMA tiles need heads in eights and a head dimension in
/// sixteens up to 128. `None`: it can.
pub fn rejects(s: &Shape) -> Option<String> {
    if !s.heads.is_multiple_of(8) {
        return Some(format!(
            "GPU reference needs heads % 8 == 0, got {}",
            s.heads
        ));
    }
    if !s.head_dim.is_multiple_of(16) || s.head_dim > 128 {
        return Some(format!(
            "GPU reference supports head_dim multiple of 16 up to 128, got {}",
            s.head_dim
        ));
    }
    None
}

/// The digest of one row's V(r) (`DeviceJudgement::row_digests`; `kernels/judge.cu`
/// makes the same on the device): a sum of a mix of (position, bits), so the order the
/// device adds it in does not matter.
pub fn row_digest(valid: &[f32]) -> u64 {
    fn mix64(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
    valid.iter().enumerate().fold(0u64, |h, (t, x)| {
        h.wrapping_add(mix64(((t as u64) << 32) ^ x.to_bits() as u64))
    })
}

/// How a device-judged run proves that the kernel left its KV cache as it was
/// (`MQA_FUZZ_CACHE_CHECK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheCheck {
    /// `read-only` (the default): a pool of at least [`READ_ONLY_MIN_BYTES`] is handed
    /// to the kernel through a read-only mapping, so a store into it faults; such a
    /// crash is run again with the cache writable, to name it (`input_mutated`).
    ReadOnly,
    /// `read-back`: the kernel always gets a writable cache, read whole after the run.
    ReadBack,
}

/// The variable that chooses the [`CacheCheck`].
pub const CACHE_CHECK_VAR: &str = "MQA_FUZZ_CACHE_CHECK";

/// Pools at least this large are handed to the kernel read-only under
/// [`CacheCheck::ReadOnly`]: reading a smaller one after the run costs under ~0.3 ms,
/// less than a crash's second run would.
pub const READ_ONLY_MIN_BYTES: u64 = 1 << 30;

impl CacheCheck {
    /// The policy `MQA_FUZZ_CACHE_CHECK` asks for (unset: `read-only`), or a one-line
    /// error naming the variable.
    pub fn from_env() -> Result<CacheCheck, String> {
        Self::parse(std::env::var(CACHE_CHECK_VAR).ok().as_deref())
    }

    fn parse(value: Option<&str>) -> Result<CacheCheck, String> {
        match value.map(str::trim) {
            None | Some("") | Some("read-only") => Ok(CacheCheck::ReadOnly),
            Some("read-back") => Ok(CacheCheck::ReadBack),
            Some(v) => Err(format!(
                "{CACHE_CHECK_VAR}={v:?}: use read-only or read-back"
            )),
        }
    }

    /// The process's policy (read once; an unusable value reads as `read-back`, the
    /// check that needs no second run: `mqa-fuzz` refuses such a value at start).
    pub fn current() -> CacheCheck {
        static POLICY: OnceLock<CacheCheck> = OnceLock::new();
        *POLICY.get_or_init(|| Self::from_env().unwrap_or(CacheCheck::ReadBack))
    }

    /// Whether a device-judged run of `case` gets its cache read-only.
    pub fn read_only_for(self, case: &Case) -> bool {
        self == CacheCheck::ReadOnly && case.kv_cache_bytes() >= READ_ONLY_MIN_BYTES
    }
}

/// What handing each kernel its cache read-only has cost: a crash under it is run again
/// with the cache writable (a worker restart and a second run, ~0.1–0.2 s for a library
/// that loads its kernels per process), where reading the pool back costs ~5–10 ms. A
/// kernel that crashes often (DeepGEMM's all-zero-batch crash, its shrinking) gets its
/// cache read back instead. Clones share the tally.
#[derive(Clone, Debug, Default)]
pub struct ReadOnlyTally(Arc<Mutex<HashMap<String, ReadOnlyRuns>>>);

#[derive(Clone, Copy, Debug, Default)]
struct ReadOnlyRuns {
    runs: u64,
    reruns: u64,
    /// Read back from now on.
    off: bool,
}

impl ReadOnlyTally {
    /// Second runs a kernel may cost before their rate counts.
    const FREE_RERUNS: u64 = 8;
    /// More than one second run in this many read-only runs: reading back is cheaper.
    const RUNS_PER_RERUN: u64 = 50;

    /// Whether `kernel` still gets its cache read-only.
    pub fn allows(&self, kernel: &str) -> bool {
        let t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        !t.get(kernel).is_some_and(|r| r.off)
    }

    /// Counts a read-only run of `kernel` (`rerun`: it crashed and ran again); returns
    /// a line to tell the user when this turns the read-only cache off for it.
    pub fn count(&self, kernel: &str, rerun: bool) -> Option<String> {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let r = t.entry(kernel.to_string()).or_default();
        r.runs += 1;
        r.reruns += u64::from(rerun);
        let costly = r.reruns > Self::FREE_RERUNS && r.reruns * Self::RUNS_PER_RERUN > r.runs;
        (costly && !r.off).then(|| {
            r.off = true;
            format!(
                "{kernel} crashed {} times in {} runs with its KV cache read-only, each run \
                 again with the cache writable: from now on its cache is read back after \
                 each run instead",
                r.reruns, r.runs
            )
        })
    }
}

/// What the harness asks a kernel that judges on its device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceJudgeRequest {
    /// The kernel's scale placement (the reference to compute).
    pub placement: ScalePlacement,
    /// The error bound's coefficients (`oracle::ErrorBound`): `dot_rel`, `head_rel`,
    /// `abs`, as f64 bits (JSON numbers would not carry them exactly).
    pub bound_bits: [u64; 3],
    /// Elements whose output, reference and class come back for the CPU to re-check:
    /// `(row, position)`, each inside V(r).
    pub checks: Vec<(u32, u32)>,
    /// Only the rows' digests (a property's re-run): no reference, no judge.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub digest_only: bool,
    /// Hand the kernel its KV cache through a read-only mapping (a store faults) instead
    /// of reading the whole cache after the run ([`CacheCheck`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only_cache: bool,
}

impl DeviceJudgeRequest {
    /// `bound`: `dot_rel`, `head_rel`, `abs`.
    pub fn new(placement: ScalePlacement, bound: [f64; 3], checks: Vec<(u32, u32)>) -> Self {
        DeviceJudgeRequest {
            placement,
            bound_bits: bound.map(f64::to_bits),
            checks,
            digest_only: false,
            read_only_cache: false,
        }
    }

    /// A re-run that only digests the output (properties).
    pub fn digests(placement: ScalePlacement) -> Self {
        DeviceJudgeRequest {
            placement,
            bound_bits: [0; 3],
            checks: Vec::new(),
            digest_only: true,
            read_only_cache: false,
        }
    }

    pub fn bound(&self) -> [f64; 3] {
        self.bound_bits.map(f64::from_bits)
    }
}

/// The class the device judge gave one element (`kernels/judge.cu`'s `C_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceClass {
    Ok,
    Mismatch,
    Nan,
    Inf,
    Unwritten,
    /// The exact value is not a finite f32 (hostile inputs): not judged.
    Undefined,
}

impl DeviceClass {
    pub fn from_code(c: i32) -> Option<DeviceClass> {
        Some(match c {
            0 => DeviceClass::Ok,
            1 => DeviceClass::Mismatch,
            2 => DeviceClass::Nan,
            3 => DeviceClass::Inf,
            4 => DeviceClass::Unwritten,
            5 => DeviceClass::Undefined,
            _ => return None,
        })
    }
}

/// One re-checked element as the device saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckedElement {
    pub row: u32,
    pub pos: u32,
    /// The kernel's output bits.
    pub got_bits: u32,
    /// The GPU reference's value and relu magnitude (f64 bits).
    pub value_bits: u64,
    pub relu_mag_bits: u64,
    pub class: DeviceClass,
}

/// Counts over one case's output, as the device judge made them (the oracle's
/// `Verdict` is built from them by `oracle::device_verdict`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceJudgement {
    /// Rows judged (`batch * next_n`).
    pub rows: u64,
    /// Elements of V(r) by class.
    pub ok: u64,
    pub mismatch: u64,
    pub nan: u64,
    pub inf: u64,
    pub unwritten: u64,
    pub undefined: u64,
    /// What the kernel gave where the exact value is undefined.
    pub hostile_nan: u64,
    pub hostile_inf: u64,
    pub hostile_finite: u64,
    /// Elements `nan_to_num_(-inf)` would change, and the rows holding one.
    pub guard_nan: u64,
    pub guard_pos_inf: u64,
    pub guard_neg_inf: u64,
    pub guard_rows: u64,
    /// Outside V(r), in `[len, max_model_len)` of each row.
    pub outside_elements: u64,
    pub outside_unwritten: u64,
    pub outside_nan: u64,
    pub outside_neg_inf: u64,
    pub outside_pos_inf: u64,
    pub outside_finite: u64,
    /// Guard-zone and row-padding elements that are no longer the poison.
    pub oob_writes: u64,
    /// f64 bits of the error maxima and of DeepGEMM's `calc_diff` sums.
    pub max_abs_err_bits: u64,
    pub max_err_over_bound_bits: u64,
    pub sxy_bits: u64,
    pub sxx_bits: u64,
    /// Per row, an order-independent 64-bit digest of V(r)'s bits: two runs with equal
    /// digests gave the same bits (properties compare these, not outputs).
    pub row_digests: Vec<u64>,
    pub checks: Vec<CheckedElement>,
    /// Seconds of the GPU reference's kernel and of the judge on the device.
    pub reference_secs: f64,
    pub judge_secs: f64,
}

impl DeviceJudgement {
    pub fn max_abs_err(&self) -> f64 {
        f64::from_bits(self.max_abs_err_bits)
    }
    pub fn max_err_over_bound(&self) -> f64 {
        f64::from_bits(self.max_err_over_bound_bits)
    }
    pub fn calc_diff(&self) -> f64 {
        let (sxy, sxx) = (f64::from_bits(self.sxy_bits), f64::from_bits(self.sxx_bits));
        if sxx > 0.0 {
            1.0 - 2.0 * sxy / sxx
        } else {
            0.0
        }
    }
    /// Element-level findings in V(r), or writes outside the output.
    pub fn has_value_findings(&self) -> bool {
        self.mismatch + self.nan + self.inf + self.unwritten + self.oob_writes > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_check_is_read_only_unless_asked_and_refuses_other_values() {
        assert_eq!(CacheCheck::parse(None), Ok(CacheCheck::ReadOnly));
        assert_eq!(CacheCheck::parse(Some("")), Ok(CacheCheck::ReadOnly));
        assert_eq!(
            CacheCheck::parse(Some("read-back")),
            Ok(CacheCheck::ReadBack)
        );
        let e = CacheCheck::parse(Some("off")).unwrap_err();
        assert!(e.contains("MQA_FUZZ_CACHE_CHECK=\"off\""), "{e}");
    }

    #[test]
    fn a_kernel_that_crashes_often_stops_getting_a_read_only_cache() {
        let t = ReadOnlyTally::default();
        // A few crashes among many runs: still read-only.
        for k in 0..1000 {
            assert_eq!(t.count("rare", k % 100 == 0), None);
        }
        assert!(t.allows("rare"));
        // One crash in ten: off after the free ones, said once.
        let said: Vec<String> = (0..200)
            .filter_map(|k| t.count("often", k % 10 == 0))
            .collect();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("often crashed 9 times"), "{said:?}");
        assert!(!t.allows("often"));
        assert!(t.allows("rare"), "kernels are counted apart");
        // Clones share the tally.
        assert!(!t.clone().allows("often"));
    }
}
