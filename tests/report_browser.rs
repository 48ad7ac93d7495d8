//! Loads index.html in a real headless Chromium: no console errors, and the screenshot
//! shows the finding's picture (its class colours cover far more pixels than the
//! legend swatches alone). Skips, saying why, where Chromium is not installed
//! (Debian/Ubuntu: `apt-get install -y chromium`).

mod support;

use mqa_fuzz::report::{write_all, CellClass};
use std::path::{Path, PathBuf};
use std::process::Command;

use support::skip::{trial, Ran};

fn main() {
    support::skip::main(vec![trial(
        "index_html_renders_in_headless_chromium",
        index_html_renders_in_headless_chromium,
    )])
}

fn chromium() -> Option<PathBuf> {
    for name in [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ] {
        if let Ok(o) = Command::new("which").arg(name).output() {
            if o.status.success() {
                let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
                if !p.is_empty() {
                    return Some(PathBuf::from(p));
                }
            }
        }
    }
    None
}

/// Screenshots `page` (1200×1600) and returns the PNG path and Chromium's console lines.
fn render(browser: &Path, page: &Path, work: &Path) -> (PathBuf, Vec<String>) {
    let shot = work.join(format!(
        "{}.png",
        page.file_stem().unwrap().to_string_lossy()
    ));
    let profile = tempfile::tempdir().unwrap();
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=1200,1600",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success() && shot.is_file(),
        "chromium failed ({:?}):\n{stderr}",
        o.status
    );
    // Chromium logs every console message (errors, uncaught exceptions, CSP and mixed
    // content reports) as `INFO:CONSOLE`; the report has no scripts, so there must be none.
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(String::from)
        .collect();
    (shot, console)
}

fn pixels_of(png_path: &Path, rgb: (u8, u8, u8)) -> usize {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(
        channels >= 3 && info.bit_depth == png::BitDepth::Eight,
        "{:?} {:?}",
        info.color_type,
        info.bit_depth
    );
    buf[..info.buffer_size()]
        .chunks_exact(channels)
        .filter(|p| (p[0], p[1], p[2]) == rgb)
        .count()
}

fn index_html_renders_in_headless_chromium() -> Ran {
    let Some(browser) = chromium() else {
        return Err("no chromium on PATH (apt-get install -y chromium)".into());
    };
    let work = tempfile::tempdir().unwrap();
    let report = support::campaign("cpu:bug-tail-unwritten", "production", &[1, 2], None);
    let dir = work.path().join("run");
    write_all(&dir, &report).unwrap();

    // Negative control: the console check must see a broken page's errors.
    let bad = work.path().join("broken.html");
    std::fs::write(
        &bad,
        "<!DOCTYPE html><html><body><p>x</p><script>no_such_function();</script></body></html>",
    )
    .unwrap();
    let (_, console) = render(&browser, &bad, work.path());
    assert!(
        console.iter().any(|l| l.contains("no_such_function")),
        "the console check is blind: {console:?}"
    );

    let (shot, console) = render(&browser, &dir.join("index.html"), work.path());
    assert!(
        console.is_empty(),
        "console messages from index.html: {console:#?}"
    );
    // A legend swatch is 12×12 = 144 px; the picture's cells are far more.
    let unwritten = pixels_of(&shot, CellClass::Unwritten.rgb());
    let ok = pixels_of(&shot, CellClass::Ok.rgb());
    let outside = pixels_of(&shot, CellClass::Outside.rgb());
    eprintln!(
        "screenshot {}: unwritten {unwritten} px, ok {ok} px, outside {outside} px",
        shot.display()
    );
    assert!(
        unwritten > 2000,
        "the unwritten cells are not on screen ({unwritten} px)"
    );
    assert!(ok > 2000, "the ok cells are not on screen ({ok} px)");
    assert!(
        outside > 2000,
        "the outside-V(r) cells are not on screen ({outside} px)"
    );
    // The mismatch colour belongs to no element of this case: its absence shows the
    // pixel counts measure the picture, not a palette drawn regardless.
    assert_eq!(pixels_of(&shot, CellClass::Mismatch.rgb()), 0);
    Ok(())
}
