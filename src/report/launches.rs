//! Kernel launch times by shape class: the medians the terminal, `summary.md` and the
//! report's readers see beside the verdict.

use super::model::Report;

/// Median kernel launch time per shape class, the most frequent classes first, as
/// `(kernel, class, median µs, launches)`; at most `most` classes per kernel.
pub fn launch_medians(r: &Report, most: usize) -> Vec<(String, String, f64, u64)> {
    let mut out = Vec::new();
    for (name, k) in &r.per_kernel {
        let mut classes: Vec<_> = k.kernel_time_by_shape.iter().collect();
        classes.sort_by(|a, b| b.1.launches.cmp(&a.1.launches).then(a.0.cmp(b.0)));
        for (class, t) in classes.into_iter().take(most) {
            out.push((name.clone(), class.clone(), t.median_us(), t.launches));
        }
    }
    out
}

/// One terminal line per kernel with its most frequent shape classes' median times.
pub fn launch_lines(r: &Report) -> Vec<String> {
    let mut lines: Vec<(String, Vec<String>)> = Vec::new();
    for (kernel, class, us, n) in launch_medians(r, 3) {
        let item = format!("{class} {} ({n})", show_us(us));
        match lines.last_mut() {
            Some((k, v)) if *k == kernel => v.push(item),
            _ => lines.push((kernel, vec![item])),
        }
    }
    lines
        .into_iter()
        .map(|(k, v)| {
            format!(
                "kernel time, median per shape class (launches): {k}: {}",
                v.join("; ")
            )
        })
        .collect()
}

/// `382 µs`, `12.3 ms`, `1.20 s`.
pub fn show_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e4 {
        format!("{:.1} ms", us / 1e3)
    } else if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.0} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::KernelStats;

    #[test]
    fn launch_medians_per_shape_class_merge_across_shards() {
        let mut a = crate::report::LaunchTimes::default();
        for us in [100.0, 110.0, 120.0, 5000.0] {
            a.record(us * 1e-6);
        }
        let mut b = crate::report::LaunchTimes::default();
        for us in [105.0, 115.0, 6000.0, 7000.0, 8000.0] {
            b.record(us * 1e-6);
        }
        // 9 launches: the 5th smallest (120 µs) is the median, within a bucket (±2.2%).
        let mut m = a.clone();
        m.merge(&b);
        assert_eq!(m.launches, 9);
        assert!(
            (m.median_us() / 120.0 - 1.0).abs() < 0.03,
            "{}",
            m.median_us()
        );
        assert!(
            (a.median_us() / 110.0 - 1.0).abs() < 0.03,
            "{}",
            a.median_us()
        );
        let mut r = Report::default();
        let mut k = KernelStats::default();
        k.kernel_time_by_shape
            .insert("H64 D128 N2 tokens<=2M".into(), m);
        k.kernel_time_by_shape
            .insert("H8 D64 N1 tokens<=1K".into(), a);
        r.per_kernel.insert("cuda:tiled".into(), k);
        let lines = launch_lines(&r);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("cuda:tiled: H64 D128 N2 tokens<=2M 120")
                && lines[0].contains("µs (9)"),
            "{lines:?}"
        );
    }
}
