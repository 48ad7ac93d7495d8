//! The signatures the corpus directory holds: a failure of a signature a corpus file
//! holds shrunk is not shrunk again. Files this campaign replayed are in the book
//! already (their failures are explained by [`Book::explained`]); the others (another
//! shard's, every file under `--no-replay`) are indexed here from their saved
//! signature, and the first failure one of them explains is filed as that finding: its
//! saved case is judged once (the finding's verdict and picture) instead of shrinking
//! the failure and ablating it again.

use super::{Book, Ctx, Failure, Subject};
use crate::campaign::engine::pair_name;
use crate::campaign::shrink::Shrunk;
use crate::campaign::subject::localise;
use crate::campaign::Detection;
use crate::case::CaseFile;
use crate::finding::signature::same_bug_classes;
use crate::finding::{crash_reason, shows, Feature, Signature, Trigger};
use crate::generate::Recipe;
use crate::oracle::Class;
use std::path::{Path, PathBuf};

/// A corpus file's saved signature.
#[derive(Clone)]
pub(in crate::campaign) struct Saved {
    path: PathBuf,
    kernel: String,
    class: Class,
    reason: Option<String>,
    trigger: Vec<Feature>,
    /// Filed already, or its case no longer shows the bug.
    done: bool,
}

/// The class, reason and trigger of signature `key` of kernel (or pair) `name`
/// ([`Signature::key`]: `name|class[|reason][|needs:a+b]`); `None` when it is not one.
pub(in crate::campaign) fn parse_key(
    name: &str,
    key: &str,
) -> Option<(Class, Option<String>, Vec<Feature>)> {
    let rest = key.strip_prefix(name)?.strip_prefix('|')?;
    let (head, needs) = match rest.rsplit_once("|needs:") {
        Some((h, n)) => (h, Some(n)),
        None => (rest, None),
    };
    let (class, reason) = match head.split_once('|') {
        Some((c, r)) => (c, Some(r.to_string())),
        None => (head, None),
    };
    let class = Class::parse(class)?;
    let trigger = needs
        .map(|n| {
            n.split('+')
                .map(|x| Feature::ALL.into_iter().find(|f| f.name() == x))
                .collect::<Option<Vec<_>>>()
        })
        .unwrap_or(Some(Vec::new()))?;
    let sig = Signature {
        kernel: name.to_string(),
        class,
        reason: reason.clone(),
        trigger: trigger.clone(),
    };
    (sig.key() == key).then_some((class, reason, trigger))
}

/// The kernel (or pair) a corpus file's finding is of.
fn kernel_of(p: &crate::case::Provenance) -> String {
    match &p.kernels[..] {
        [a, b, ..] => pair_name(a, b),
        _ => p.kernel.clone(),
    }
}

/// The trigger a corpus file saved for a finding of `name`, `class` and `reason`, when
/// its signature is one of those.
pub(in crate::campaign) fn saved_trigger(
    name: &str,
    class: Class,
    reason: Option<&str>,
    file: &CaseFile,
) -> Option<Vec<Feature>> {
    let key = file.provenance.signature.as_deref()?;
    let (c, r, trigger) = parse_key(name, key)?;
    (c == class && r.as_deref() == reason).then_some(trigger)
}

/// The saved recipe of a corpus file, if it has one this version reads.
pub(in crate::campaign) fn saved_recipe(file: &CaseFile) -> Option<Recipe> {
    read_recipe(file).ok().flatten()
}

/// The saved recipe of a corpus file (`None`: it has none), or why this version cannot
/// read the one it has (`provenance.recipe: …`).
pub(in crate::campaign) fn read_recipe(file: &CaseFile) -> Result<Option<Recipe>, String> {
    file.provenance
        .recipe
        .as_ref()
        .map(|r| serde_json::from_value(r.clone()))
        .transpose()
        .map_err(|e| format!("provenance.recipe: {e}"))
}

/// A corpus file's provenance only (the case, possibly large, is skipped).
fn provenance(path: &Path) -> Option<crate::case::Provenance> {
    #[derive(serde::Deserialize)]
    struct Head {
        provenance: crate::case::Provenance,
    }
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice::<Head>(&text)
        .ok()
        .map(|h| h.provenance)
}

impl Book {
    /// Indexes the shrunk findings of the corpus directory's files not in `replayed`.
    pub fn index_corpus(&mut self, cfg: &crate::campaign::Config, replayed: &[PathBuf]) {
        for path in crate::campaign::corpus::list(&cfg.corpus_dir) {
            if replayed.contains(&path) {
                continue;
            }
            let Some(p) = provenance(&path).filter(|p| p.shrunk) else {
                continue;
            };
            let kernel = kernel_of(&p);
            let key = p.signature.as_deref().unwrap_or_default();
            if let Some((class, reason, trigger)) = parse_key(&kernel, key) {
                self.saved.push(Saved {
                    path,
                    kernel,
                    class,
                    reason,
                    trigger,
                    done: false,
                });
            }
        }
    }

    /// Files failure `f` (class, reason and features given) as the finding of a corpus
    /// file that explains it, if one does and its saved case still shows the bug; the
    /// finding's index.
    pub(super) fn file_as_saved(
        &mut self,
        ctx: &mut Ctx,
        subject: &Subject,
        f: &Failure,
        (class, reason, feats): (Class, &Option<String>, &[Feature]),
    ) -> Option<usize> {
        let name = subject.name();
        let classes = f.verdict.finding_classes();
        let crash = crash_reason(&f.verdict);
        let j = self.saved.iter().position(|e| {
            !e.done
                && e.kernel == name
                && e.reason == crash.clone().filter(|_| e.class == Class::Crash)
                && classes
                    .iter()
                    .any(|&c| same_bug_classes(e.class, c, !e.trigger.is_empty()))
                && e.trigger.iter().all(|x| feats.contains(x))
        })?;
        self.saved[j].done = true;
        let e = self.saved[j].clone();
        let file = crate::case::load_case_file(&e.path).ok()?;
        let (verdict, evidence) = subject.judge(ctx.engine, &file.case);
        if !shows(&verdict, e.class, e.reason.as_deref()) {
            return None;
        }
        let sig = Signature {
            kernel: name.clone(),
            class: e.class,
            reason: e.reason.clone(),
            trigger: e.trigger.clone(),
        };
        let key = sig.key();
        ctx.progress.println(&format!(
            "finding: {name} {class}{} on {}: signature {key}, which {} holds shrunk; not shrunk again",
            reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
            f.origin.map_or("a case met while shrinking".into(), |(k, _)| format!("case {k}")),
            e.path.display()
        ));
        self.known_from_corpus += 1;
        if let Some(&i) = self.by_key.get(&key) {
            self.count(i);
            return Some(i);
        }
        let recipe = saved_recipe(&file).unwrap_or_else(|| Recipe::small(vec![1], 1, 0));
        let trigger = Trigger::new(&recipe, e.trigger.clone(), true);
        let shrunk = Shrunk {
            shrunk: true,
            evidence,
            ..Shrunk::unshrunk(&recipe, &file.case, &verdict)
        };
        let path = Some(e.path.clone());
        let mut finding = self.finding(
            ctx,
            subject,
            &sig,
            &trigger,
            &shrunk,
            path,
            file.provenance.seed,
        );
        if let Subject::Kernel(k) = subject {
            localise(ctx, &mut finding, *k);
        }
        self.detections.push(Detection {
            signature: key,
            class: sig.class,
            cases: ctx.generated,
            secs: ctx.started.elapsed().as_secs_f64(),
        });
        let i = self.findings.len();
        self.add(sig, finding);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_key_parses_back_and_anything_else_does_not() {
        let sig = Signature {
            kernel: "numpy --plant a|b".into(),
            class: Class::Crash,
            reason: Some("illegal memory access".into()),
            trigger: vec![Feature::NextN2, Feature::Lens2d],
        };
        let (c, r, t) = parse_key(&sig.kernel, &sig.key()).unwrap();
        assert_eq!(
            (c, r, t),
            (sig.class, sig.reason.clone(), sig.trigger.clone())
        );
        assert_eq!(
            parse_key("k", "k|unwritten"),
            Some((Class::Unwritten, None, vec![]))
        );
        assert_eq!(parse_key("k", "other|unwritten"), None);
        assert_eq!(parse_key("k", "k|no-such-class"), None);
        assert_eq!(parse_key("k", "k|nan|needs:no-such-feature"), None);
    }
}
