//! SVG renderings of a [`ClassMap`] and an error histogram: plain text, no fonts or
//! scripts fetched, so they embed inline in `index.html` and open on their own.

use super::model::{CellClass, ClassMap};
use super::picture::{FIRST_OUT_OF_BOUND_BIN, HISTOGRAM_BINS, NON_FINITE_BIN};
use std::fmt::Write;

/// Escapes text for XML/HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

const FONT: &str = "font-family=\"sans-serif\" font-size=\"11\"";

/// The class map as SVG: one rectangle per run of equal cells, rows top to bottom,
/// positions left to right, axis ranges and a legend of the classes shown.
pub fn class_map_svg(map: &ClassMap, title: &str) -> String {
    let ncols = map
        .cells
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
        .max(1);
    let nrows = map.cells.len().max(1);
    // Pixels per cell: a picture about 720 × (up to) 400 px, cells never below 2 px.
    let cw = (720 / ncols).clamp(2, 24);
    let ch = (400 / nrows).clamp(3, 24);
    let (left, top) = (64usize, 22usize);
    let (pw, ph) = (ncols * cw, nrows * ch);
    let shown = map.classes_shown();
    let legend_rows = shown.len().div_ceil(3);
    let width = (left + pw + 16).max(600);
    let height = top + ph + 40 + legend_rows * 18 + 8;
    let mut s = svg_open(
        width,
        height,
        " shape-rendering=\"crispEdges\"",
        title,
        left,
    );
    for (i, line) in map.cells.iter().enumerate() {
        let y = top + i * ch;
        let chars: Vec<char> = line.chars().collect();
        let mut j = 0;
        while j < chars.len() {
            let mut k = j + 1;
            while k < chars.len() && chars[k] == chars[j] {
                k += 1;
            }
            let class = CellClass::from_code(chars[j]).unwrap_or(CellClass::Outside);
            let _ = write!(
                s,
                "<rect x=\"{}\" y=\"{y}\" width=\"{}\" height=\"{ch}\" fill=\"{}\"/>",
                left + j * cw,
                (k - j) * cw,
                class.hex()
            );
            j = k;
        }
    }
    let _ = write!(s, "<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444444\"/>");
    // Axes: first and last row and position of the window.
    let row_last = map.row_end.saturating_sub(1);
    let col_last = map.col_end.saturating_sub(1);
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" {FONT} text-anchor=\"end\">row {}</text>",
        left - 4,
        top + 10,
        map.row_start
    );
    // One label when the window is a single cell row tall (they would overlap).
    if ph >= 2 * 12 && row_last > map.row_start {
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" {FONT} text-anchor=\"end\">row {row_last}</text>",
            left - 4,
            top + ph
        );
    }
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"{}\" {FONT}>pos {}</text>",
        top + ph + 13,
        map.col_start
    );
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" {FONT} text-anchor=\"end\">pos {col_last}</text>",
        left + pw,
        top + ph + 13
    );
    let scale = if map.rows_per_cell > 1 || map.cols_per_cell > 1 {
        format!(
            "; one cell = {} row(s) × {} position(s), worst class shown",
            map.rows_per_cell, map.cols_per_cell
        )
    } else {
        String::new()
    };
    let zoom = if map.whole_case {
        format!(
            "whole case: {} rows × {} positions (max_model_len)",
            map.rows, map.cols
        )
    } else {
        format!(
            "zoomed to the findings of a case of {} rows × {} positions (max_model_len)",
            map.rows, map.cols
        )
    };
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"{}\" {FONT} fill=\"#555555\">{}{}</text>",
        top + ph + 27,
        escape(&zoom),
        escape(&scale)
    );
    for (i, c) in shown.iter().enumerate() {
        let x = left + (i % 3) * 210;
        let y = top + ph + 36 + (i / 3) * 18;
        let _ = write!(
            s,
            "<rect x=\"{x}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\" stroke=\"#444444\"/>",
            c.hex()
        );
        let n = map.counts.get(c.name()).copied().unwrap_or(0);
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" {FONT}>{} ({n})</text>",
            x + 16,
            y + 10,
            escape(c.label())
        );
    }
    s.push_str("</svg>");
    s
}

/// The error histogram as SVG: bar heights on a log scale (counts span many decades),
/// bins within the bound green, outside orange, non-finite red; a dashed line marks the
/// bound.
pub fn histogram_svg(hist: &[u64], title: &str) -> String {
    let n = hist.len().max(1);
    let (left, top, bw, ph) = (40usize, 22usize, 44usize, 120usize);
    let width = left + n * bw + 16;
    let height = top + ph + 36;
    let max = hist.iter().copied().max().unwrap_or(0).max(1) as f64;
    let mut s = svg_open(width, height, "", title, left);
    for (i, &count) in hist.iter().enumerate() {
        let h = if count == 0 {
            0.0
        } else {
            ((count as f64).log10() + 1.0) / (max.log10() + 1.0) * ph as f64
        };
        let colour = if i >= NON_FINITE_BIN {
            CellClass::Nan
        } else if i >= FIRST_OUT_OF_BOUND_BIN {
            CellClass::Mismatch
        } else {
            CellClass::Ok
        };
        let x = left + i * bw;
        let y = top as f64 + ph as f64 - h;
        let _ = write!(s, "<rect x=\"{}\" y=\"{y:.1}\" width=\"{}\" height=\"{h:.1}\" fill=\"{}\"><title>{}: {count}</title></rect>", x + 2, bw - 4, colour.hex(), escape(HISTOGRAM_BINS.get(i).copied().unwrap_or("?")));
        if count > 0 {
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" {FONT} text-anchor=\"middle\">{count}</text>",
                x + bw / 2,
                y - 2.0
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" {FONT} text-anchor=\"middle\">{}</text>",
            x + bw / 2,
            top + ph + 13,
            escape(HISTOGRAM_BINS.get(i).copied().unwrap_or("?"))
        );
    }
    let bx = left + FIRST_OUT_OF_BOUND_BIN * bw;
    let _ = write!(s, "<line x1=\"{bx}\" y1=\"{top}\" x2=\"{bx}\" y2=\"{}\" stroke=\"#444444\" stroke-dasharray=\"4 3\"/>", top + ph);
    let _ = write!(s, "<text x=\"{left}\" y=\"{}\" {FONT} fill=\"#555555\">|err| / bound per element of V(r); log-scale counts; dashed line = bound</text>", top + ph + 28);
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444444\"/>",
        top + ph,
        left + n * bw,
        top + ph
    );
    s.push_str("</svg>");
    s
}

/// The opening every picture shares: the `<svg>` element (with `attrs`), its title for
/// screen readers, a white background and the title drawn at `left`.
fn svg_open(width: usize, height: usize, attrs: &str, title: &str, left: usize) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\"{attrs} role=\"img\">"
    );
    let _ = write!(s, "<title>{}</title>", escape(title));
    let _ = write!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" fill=\"#ffffff\"/>"
    );
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"14\" {FONT}>{}</text>",
        escape(title)
    );
    s
}
