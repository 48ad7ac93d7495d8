//! A campaign's partition: [`Shard`] `I/N` splits the seeds and corpus files so that
//! shards never overlap, and which shard this process is, from the scheduler's
//! environment, so that one job definition serves every shard of a Slurm array or a
//! Kubernetes indexed Job. A foundation module: the campaign partitions by it and the
//! report records it (`report.json`'s `shard`, a merged report's `merged_shards`).

use crate::error::Fatal;
use serde::{Deserialize, Serialize};

/// Shard `index` of `count` (0-based): the seeds a campaign runs are partitioned so that
/// shards never overlap.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    /// `I/N` with `0 <= I < N`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("expected I/N (e.g. 0/4), found {s:?}"))?;
        let index: u32 = i
            .trim()
            .parse()
            .map_err(|_| format!("shard index {i:?} is not a non-negative integer"))?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("shard count {n:?} is not a positive integer"))?;
        Shard::new(index, count)
    }
}

impl Shard {
    pub fn new(index: u32, count: u32) -> Result<Shard, String> {
        if count == 0 {
            return Err("shard count must be at least 1".into());
        }
        if index >= count {
            return Err(format!(
                "shard index {index} must be below the count {count} (indices are 0-based)"
            ));
        }
        Ok(Shard { index, count })
    }
}

/// The shard from `SLURM_ARRAY_TASK_ID`/`SLURM_ARRAY_TASK_COUNT` (Slurm job arrays) or
/// `JOB_COMPLETION_INDEX`/`JOB_COMPLETIONS` (Kubernetes indexed Jobs; Kubernetes sets
/// only the index, the Job spec must pass `JOB_COMPLETIONS` = `.spec.completions`).
/// `Ok(None)` when neither is set; exit 2 naming the variable when one is malformed.
pub fn shard_from_env() -> Result<Option<Shard>, Fatal> {
    shard_from_vars(|k| std::env::var(k).ok())
}

/// [`shard_from_env`] over any variable lookup (tests cannot safely mutate the
/// process environment while other tests run).
///
/// Slurm arrays need not start at 0 or step by 1 (`--array=1-8`, `--array=0-15:4`):
/// the index is `(TASK_ID - TASK_MIN) / TASK_STEP` when those are set.
pub fn shard_from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Shard>, Fatal> {
    let num = |name: &str| -> Result<Option<u32>, Fatal> {
        match get(name) {
            None => Ok(None),
            Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
                Fatal::usage(format!(
                    "environment variable {name}={v:?} is not a non-negative integer"
                ))
            }),
        }
    };
    let (index_var, count_var, index, count) = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
        let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
        let step = num("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1);
        if step == 0 {
            return Err(Fatal::usage(
                "environment variable SLURM_ARRAY_TASK_STEP=\"0\" must be at least 1",
            ));
        }
        if id < min || (id - min) % step != 0 {
            return Err(Fatal::usage(format!(
                "environment variable SLURM_ARRAY_TASK_ID={id} is not on the array's grid (SLURM_ARRAY_TASK_MIN={min}, SLURM_ARRAY_TASK_STEP={step})"
            )));
        }
        let count = num("SLURM_ARRAY_TASK_COUNT")?.ok_or_else(|| {
            Fatal::usage(
                "environment variable SLURM_ARRAY_TASK_COUNT is not set but SLURM_ARRAY_TASK_ID is",
            )
        })?;
        (
            "SLURM_ARRAY_TASK_ID",
            "SLURM_ARRAY_TASK_COUNT",
            (id - min) / step,
            count,
        )
    } else if let Some(idx) = num("JOB_COMPLETION_INDEX")? {
        let count = num("JOB_COMPLETIONS")?.ok_or_else(|| {
            Fatal::usage("environment variable JOB_COMPLETIONS is not set but JOB_COMPLETION_INDEX is (pass .spec.completions in the Job's env)")
        })?;
        ("JOB_COMPLETION_INDEX", "JOB_COMPLETIONS", idx, count)
    } else {
        return Ok(None);
    };
    Shard::new(index, count).map(Some).map_err(|e| {
        Fatal::usage(format!(
            "environment variables {index_var}/{count_var}: {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn slurm_kubernetes_and_none() {
        assert_eq!(shard_from_vars(vars(&[])).unwrap(), None);
        let s = shard_from_vars(vars(&[
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]))
        .unwrap();
        assert_eq!(s, Some(Shard { index: 3, count: 4 }));
        // --array=1-8: ids 1..=8, count 8.
        let s = shard_from_vars(vars(&[
            ("SLURM_ARRAY_TASK_ID", "8"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "8"),
        ]))
        .unwrap();
        assert_eq!(s, Some(Shard { index: 7, count: 8 }));
        // --array=0-12:4: ids 0,4,8,12.
        let s = shard_from_vars(vars(&[
            ("SLURM_ARRAY_TASK_ID", "8"),
            ("SLURM_ARRAY_TASK_STEP", "4"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]))
        .unwrap();
        assert_eq!(s, Some(Shard { index: 2, count: 4 }));
        let s = shard_from_vars(vars(&[
            ("JOB_COMPLETION_INDEX", "0"),
            ("JOB_COMPLETIONS", "2"),
        ]))
        .unwrap();
        assert_eq!(s, Some(Shard { index: 0, count: 2 }));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (pairs, var) in [
            (
                vec![
                    ("SLURM_ARRAY_TASK_ID", "x"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ],
                "SLURM_ARRAY_TASK_ID",
            ),
            (vec![("SLURM_ARRAY_TASK_ID", "1")], "SLURM_ARRAY_TASK_COUNT"),
            (
                vec![
                    ("SLURM_ARRAY_TASK_ID", "4"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ],
                "SLURM_ARRAY_TASK_ID",
            ),
            (
                vec![
                    ("SLURM_ARRAY_TASK_ID", "1"),
                    ("SLURM_ARRAY_TASK_COUNT", "-2"),
                ],
                "SLURM_ARRAY_TASK_COUNT",
            ),
            (vec![("JOB_COMPLETION_INDEX", "2")], "JOB_COMPLETIONS"),
            (
                vec![("JOB_COMPLETION_INDEX", "2"), ("JOB_COMPLETIONS", "0")],
                "JOB_COMPLETIONS",
            ),
        ] {
            let e = shard_from_vars(vars(&pairs)).unwrap_err();
            assert_eq!(e.code, crate::error::exit::USAGE);
            assert!(e.message.contains(var), "{pairs:?}: {}", e.message);
        }
    }

    #[test]
    fn parses_i_of_n() {
        assert_eq!(
            "2/5".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 5 }
        );
        assert!("5/5".parse::<Shard>().is_err());
        assert!("1".parse::<Shard>().is_err());
        assert!("0/0".parse::<Shard>().is_err());
    }
}
