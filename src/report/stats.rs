//! The tally of one kernel: [`KernelStats::record`] folds one verdict in (the campaign,
//! the tests) and `+=` folds two tallies (shards in `merge`, kernels), so every
//! statistic is counted by one rule.

use super::model::{shape_class, KernelStats};
use crate::case::Case;
use crate::oracle::{Class, Verdict};
use std::collections::BTreeMap;
use std::ops::AddAssign;

impl KernelStats {
    /// Folds one verdict of a case into the statistics; returns the kernel time it
    /// counted (the kernel's own clock where it reports one, else the run's wall time).
    /// `compile_key`: the case's value of the kernel's compile key, when it declares one
    /// ([`crate::kernel::compile_key_of`]): the time is also counted as a first call of
    /// that value or a steady one ([`super::model::CompileTimes`]).
    pub fn record(
        &mut self,
        v: &Verdict,
        (run_wall_secs, setup_secs): (f64, f64),
        case: &Case,
        compile_key: Option<&str>,
    ) -> f64 {
        let kernel_secs = v.run.kernel_time.map_or(run_wall_secs, |d| d.as_secs_f64());
        if v.skipped.is_some() {
            self.skipped += 1;
            return kernel_secs;
        }
        if let Some(t) = v.run.kernel_time {
            self.kernel_time_by_shape
                .entry(shape_class(case))
                .or_default()
                .record(t.as_secs_f64());
        }
        self.cases += 1;
        if v.is_clean() {
            self.clean += 1;
        } else {
            self.with_findings += 1;
        }
        for (c, n) in &v.classes {
            *self.class_totals.entry(*c).or_default() += n;
        }
        self.run_wall_secs += run_wall_secs;
        self.output_setup_secs += setup_secs;
        for (phase, t) in &v.run.phases {
            *self.call_phases.entry(phase.clone()).or_default() += t;
        }
        self.rows_checked += v.metrics.rows_checked;
        self.logits_checked += v.metrics.checked;
        self.kernel_secs += kernel_secs;
        if v.run.kernel_time.is_none() {
            self.unclocked_runs += 1;
            self.unclocked_secs += run_wall_secs;
        } else if let Some(key) = compile_key {
            // A run without a clock (a crash) says nothing about compiling.
            self.compile.record(key, kernel_secs);
        }
        // A crashed case has no output for the guard to act on: not counted either way.
        if v.classes.contains_key(&Class::Crash) {
            return kernel_secs;
        }
        let g = &mut self.guard;
        g.cases += 1;
        g.redundant_cases += v.guard.redundant as u64;
        g.rows_affected += v.guard.rows_affected;
        g.nan += v.guard.nan;
        g.pos_inf += v.guard.pos_inf;
        g.neg_inf += v.guard.neg_inf;
        self.max_err_over_bound = max_ratio(self.max_err_over_bound, v.metrics.max_err_over_bound);
        kernel_secs
    }
}

/// The larger ratio; an infinite or NaN one (a NaN element) always wins.
fn max_ratio(a: f64, b: f64) -> f64 {
    if b > a || b.is_nan() {
        b
    } else {
        a
    }
}

/// `a += b` for counts that may come from files (reports another machine wrote): a sum
/// that would overflow stays at `u64::MAX` instead of panicking or wrapping.
pub(crate) fn add(a: &mut u64, b: u64) {
    *a = a.saturating_add(b);
}

pub(crate) fn add_map<K: Ord + Clone>(into: &mut BTreeMap<K, u64>, from: &BTreeMap<K, u64>) {
    for (k, v) in from {
        add(into.entry(k.clone()).or_default(), *v);
    }
}

impl AddAssign<&KernelStats> for KernelStats {
    // Field-by-field sums, like `PropertyStats::merge`: deliberate boilerplate.
    fn add_assign(&mut self, k: &KernelStats) {
        add(&mut self.cases, k.cases);
        add(&mut self.clean, k.clean);
        add(&mut self.with_findings, k.with_findings);
        add(&mut self.skipped, k.skipped);
        add_map(&mut self.class_totals, &k.class_totals);
        add(&mut self.rows_checked, k.rows_checked);
        add(&mut self.logits_checked, k.logits_checked);
        let (g, h) = (&mut self.guard, &k.guard);
        add(&mut g.cases, h.cases);
        add(&mut g.redundant_cases, h.redundant_cases);
        add(&mut g.rows_affected, h.rows_affected);
        add(&mut g.nan, h.nan);
        add(&mut g.pos_inf, h.pos_inf);
        add(&mut g.neg_inf, h.neg_inf);
        self.kernel_secs += k.kernel_secs;
        add(&mut self.unclocked_runs, k.unclocked_runs);
        self.unclocked_secs += k.unclocked_secs;
        self.run_wall_secs += k.run_wall_secs;
        self.output_setup_secs += k.output_setup_secs;
        for (class, t) in &k.kernel_time_by_shape {
            self.kernel_time_by_shape
                .entry(class.clone())
                .or_default()
                .merge(t);
        }
        self.population.merge(&k.population);
        self.properties.merge(&k.properties);
        self.compile.merge(&k.compile);
        for (phase, t) in &k.call_phases {
            *self.call_phases.entry(phase.clone()).or_default() += t;
        }
        self.max_err_over_bound = max_ratio(self.max_err_over_bound, k.max_err_over_bound);
        let (j, l) = (&mut self.judge, &k.judge);
        add(&mut j.device_cases, l.device_cases);
        add(&mut j.device_then_cpu, l.device_then_cpu);
        add(&mut j.rechecked_elements, l.rechecked_elements);
        add(&mut j.cpu_cases, l.cpu_cases);
        add_map(&mut j.cpu_reasons, &l.cpu_reasons);
    }
}
