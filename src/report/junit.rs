//! `junit.xml`: what CI systems (Jenkins, GitLab, GitHub test reporters) show as tests.
//! One suite per kernel; in it one failing test per profile × finding signature, and
//! one passing test per profile without findings (its output is the kernel's headline).
//! The shape follows the Jenkins xUnit `junit-10.xsd` (see `tests/data/junit-10.xsd`).

use super::headline::kernel_headline;
use super::model::{KernelStats, Report};
use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};
use std::collections::BTreeSet;
use std::time::Duration;

fn secs(x: f64) -> Duration {
    Duration::try_from_secs_f64(x).unwrap_or_default()
}

/// The kernels and, per kernel, the profiles it ran under.
fn kernel_profiles(report: &Report) -> Vec<(String, BTreeSet<String>)> {
    let mut names: BTreeSet<String> = report.per_kernel.keys().cloned().collect();
    names.extend(report.findings.iter().map(|f| f.kernel.clone()));
    let run_profiles: BTreeSet<String> = report
        .profile
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    names
        .into_iter()
        .map(|k| {
            let mut p = run_profiles.clone();
            p.extend(
                report
                    .findings
                    .iter()
                    .filter(|f| f.kernel == k)
                    .map(|f| f.profile.clone()),
            );
            if p.is_empty() {
                p.insert("default".into());
            }
            (k, p)
        })
        .collect()
}

pub fn junit_xml(report: &Report) -> String {
    let mut junit = quick_junit::Report::new(format!("mqa-fuzz {}", report.run_id));
    junit.set_time(secs(report.timings.wall_secs));
    for (kernel, profiles) in kernel_profiles(report) {
        let stats = report.per_kernel.get(&kernel).cloned().unwrap_or_default();
        let mut suite = TestSuite::new(kernel.clone());
        suite.set_time(secs(stats.kernel_secs));
        suite.add_property(("headline", kernel_headline(&kernel, &stats).as_str()));
        for profile in &profiles {
            let classname = format!("mqa-fuzz.{kernel}.{profile}");
            let findings: Vec<_> = report
                .findings
                .iter()
                .filter(|f| f.kernel == kernel && &f.profile == profile)
                .collect();
            for f in &findings {
                let kind = if f.class == Some(crate::oracle::Class::Crash) {
                    NonSuccessKind::Error
                } else {
                    NonSuccessKind::Failure
                };
                let mut status = TestCaseStatus::non_success(kind);
                let classes: Vec<String> =
                    f.classes.iter().map(|(c, n)| format!("{c} x{n}")).collect();
                status.set_message(format!(
                    "{} on {} case(s): {}",
                    f.class_name(),
                    f.occurrences,
                    classes.join(", ")
                ));
                status.set_type(f.class_name());
                let mut text = format!(
                    "signature: {}\ntier: {}\n{}\nfirst offender at: {}\n{}\n",
                    f.signature,
                    f.tier.name(),
                    f.needs,
                    f.position.join(", "),
                    f.verdict
                );
                for ex in &f.verdict.examples {
                    text.push_str(&format!("  {}\n", example_line(ex)));
                }
                if let Some(file) = &f.case_file {
                    text.push_str(&format!("case file: {file}\n"));
                }
                if let Some(l) = &f.localisation {
                    text.push_str(&format!("localised: {}\n", l.sentence()));
                } else if let Some(why) = &f.localisation_skipped {
                    text.push_str(&format!("not localised: {why}\n"));
                }
                text.push_str(&format!("replay: {}\n", f.replay_command));
                status.set_description(text);
                let mut tc = TestCase::new(format!("{}: {}", f.class_name(), f.signature), status);
                tc.set_classname(classname.clone());
                suite.add_test_case(tc);
            }
            if findings.is_empty() {
                suite.add_test_case(clean_case(&kernel, &stats, &classname, profile));
            }
        }
        for tc in property_cases(report, &kernel, &stats) {
            suite.add_test_case(tc);
        }
        junit.add_test_suite(suite);
    }
    junit
        .to_string()
        .unwrap_or_else(|e| format!("<!-- junit serialization failed: {e} -->"))
}

/// One offending element as a reader wants it: `crash: <message>`, `mismatch at row 3
/// position 17: expected 1.5e0, got 1.7 (bound 1.2e-3)`.
fn example_line(e: &crate::oracle::Offender) -> String {
    let mut s = e.class.to_string();
    if let (Some(r), Some(t)) = (e.row, e.pos) {
        s.push_str(&format!(" at row {r} position {t}"));
    } else if let Some(r) = e.row {
        s.push_str(&format!(" in row {r}"));
    }
    let mut parts = Vec::new();
    if let Some(x) = e.expected {
        parts.push(format!("expected {x:e}"));
    }
    if let Some(g) = &e.got {
        parts.push(format!("got {g}"));
    }
    if let Some(b) = e.bound {
        parts.push(format!("bound {b:.3e}"));
    }
    if let Some(d) = &e.detail {
        parts.push(d.clone());
    }
    if !parts.is_empty() {
        s.push_str(": ");
        s.push_str(&parts.join(", "));
    }
    s
}

fn clean_case(kernel: &str, stats: &KernelStats, classname: &str, profile: &str) -> TestCase {
    let status = if stats.cases == 0 && stats.guard.cases == 0 {
        let mut s = TestCaseStatus::skipped();
        s.set_message(format!(
            "no case of profile {profile} ran on {kernel} ({} skipped)",
            stats.skipped
        ));
        s
    } else {
        TestCaseStatus::success()
    };
    let mut tc = TestCase::new(format!("{profile}: no findings"), status);
    tc.set_classname(classname.to_string());
    tc.set_time(secs(stats.kernel_secs));
    tc.set_system_out(kernel_headline(kernel, stats));
    tc
}

/// One test case per property checked on `kernel`: it fails only when the property is
/// broken and required (`--require`); otherwise its output is the property's verdict.
fn property_cases(report: &Report, kernel: &str, stats: &KernelStats) -> Vec<TestCase> {
    use crate::property::{verdict_line, Property};
    let mut v = Vec::new();
    for p in Property::ALL {
        let required = report.required.iter().any(|r| r == p.name());
        let Some(line) = verdict_line(kernel, &stats.properties, p, required) else {
            continue;
        };
        let t = stats.properties.tally(p);
        let status = if t.broken > 0 && required {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(line.clone());
            s.set_type(p.class().name());
            s
        } else {
            TestCaseStatus::success()
        };
        let mut tc = TestCase::new(format!("property: {}", p.name()), status);
        tc.set_classname(format!("mqa-fuzz.{kernel}.properties"));
        tc.set_system_out(line);
        v.push(tc);
    }
    v
}
