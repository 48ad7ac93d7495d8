//! The CI, Slurm and Kubernetes examples stay runnable: YAML parses (PyYAML), every
//! shell script (files and scripts embedded in YAML) passes `bash -n`, and every
//! `mqa-fuzz SUBCOMMAND --flag` they run exists in the binary's `--help`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn examples() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn ext(p: &Path) -> &str {
    p.extension().and_then(|e| e.to_str()).unwrap_or("")
}

fn bash_n(script: &str, origin: &str) {
    let mut child = Command::new("bash")
        .arg("-n")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{origin}: bash -n fails:\n{}\n{script}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `(subcommand, flags)` of every `mqa-fuzz SUB ...` command line in `text` (comment
/// lines skipped, `\` continuations joined, the command ending at `|`, `;`, `&&`, `>`).
fn invocations(text: &str) -> Vec<(String, Vec<String>)> {
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut rest = line;
        while let Some(i) = rest.find("mqa-fuzz ") {
            let cmd = &rest[i + "mqa-fuzz ".len()..];
            let end = cmd
                .find(['|', ';', '>'])
                .unwrap_or(cmd.len())
                .min(cmd.find("&&").unwrap_or(cmd.len()));
            let mut words = cmd[..end].split_whitespace();
            let sub = words.next().unwrap_or("").to_string();
            let flags = words
                .filter(|w| w.starts_with("--"))
                .map(|w| w.split('=').next().unwrap().to_string())
                .collect();
            out.push((sub, flags));
            rest = &cmd[end..];
        }
    }
    out
}

fn help(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success(), "mqa-fuzz {args:?} --help failed");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn examples_parse_and_run_only_real_subcommands() {
    let files = examples();
    let yaml: Vec<_> = files
        .iter()
        .filter(|p| matches!(ext(p), "yml" | "yaml"))
        .collect();
    let shell: Vec<_> = files
        .iter()
        .filter(|p| matches!(ext(p), "sh" | "sbatch"))
        .collect();
    assert!(
        yaml.len() >= 2 && !shell.is_empty(),
        "expected the CI, Kubernetes and Slurm examples: {files:?}"
    );

    for p in &shell {
        bash_n(
            &std::fs::read_to_string(p).unwrap(),
            &p.display().to_string(),
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/example_scripts.py");
    match Command::new("python3").arg(&script).args(&yaml).output() {
        Ok(o) if o.status.code() == Some(3) => {
            eprintln!("SKIP YAML parsing of the examples: PyYAML missing (pip install pyyaml)")
        }
        Err(e) => eprintln!("SKIP YAML parsing of the examples: python3 not runnable ({e})"),
        Ok(o) => {
            assert!(
                o.status.success(),
                "YAML examples:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            let scripts: std::collections::BTreeMap<String, Vec<String>> =
                serde_json::from_slice(&o.stdout).unwrap();
            for (file, list) in scripts {
                assert!(!list.is_empty(), "{file}: no embedded scripts found");
                for (i, s) in list.iter().enumerate() {
                    bash_n(s, &format!("{file} script {i}"));
                }
            }
        }
    }

    let top = help(&[]);
    let mut seen = std::collections::BTreeSet::new();
    for p in &files {
        for (sub, flags) in invocations(&std::fs::read_to_string(p).unwrap()) {
            let listed = top
                .lines()
                .any(|l| l.split_whitespace().next() == Some(sub.as_str()));
            assert!(
                listed,
                "{}: runs `mqa-fuzz {sub}`, which `mqa-fuzz --help` does not list",
                p.display()
            );
            let sub_help = help(&[&sub]);
            for f in flags {
                assert!(
                    sub_help.contains(&f),
                    "{}: `mqa-fuzz {sub} {f}`: no such flag",
                    p.display()
                );
            }
            seen.insert(sub);
        }
    }
    for sub in ["run", "merge", "diff"] {
        assert!(seen.contains(sub), "no example runs `mqa-fuzz {sub}`");
    }
}

#[test]
fn invocations_are_found_with_their_flags() {
    let text = "# mqa-fuzz ignored comment\n./target/release/mqa-fuzz run --kernel k \\\n  --shard 0/4 --report=r | tee x\nmqa-fuzz diff a b && mqa-fuzz merge x --out y\n";
    let inv = invocations(text);
    assert_eq!(
        inv,
        vec![
            (
                "run".to_string(),
                vec!["--kernel".to_string(), "--shard".into(), "--report".into()]
            ),
            ("diff".to_string(), vec![]),
            ("merge".to_string(), vec!["--out".to_string()]),
        ]
    );
}
