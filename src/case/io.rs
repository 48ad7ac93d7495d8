//! Corpus files: a case as JSON (`format_version`, provenance, expected verdict, the
//! case), with tensors inline as hex when small and in a sibling `.safetensors` file
//! when large. The saved case is the source of truth for replay; the seed in the
//! provenance is only a hint (strategies change, saved cases do not).
//!
//! Loading never trusts the file: sizes are checked before anything is allocated from
//! them, and every error names the file and the field.

use super::encoding::{from_hex, to_hex, F32Json};
use super::{BlockTable, Case, ContextLens, Shape, SparseKvCache};
use crate::class::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FORMAT_VERSION: u32 = 1;
/// Tensors up to this many bytes stay inline in the JSON.
pub const INLINE_LIMIT: usize = 64 * 1024;
/// Block tables up to this many entries stay in the JSON; larger ones go to the
/// safetensors sibling.
pub const TABLE_INLINE_MAX: usize = 64 * 1024;
/// Largest corpus JSON file we read.
pub const MAX_JSON_BYTES: u64 = 256 << 20;
/// Largest sibling safetensors file we read.
pub const MAX_TENSOR_BYTES: u64 = 4 << 30;

/// Where a saved case came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// mqa-fuzz version that wrote the file.
    #[serde(default)]
    pub tool_version: String,
    /// Kernel that failed (or `hand-made`).
    #[serde(default)]
    pub kernel: String,
    /// For a `divergent` finding: the kernels that disagreed, first `kernel` (replay
    /// runs them all and compares them again). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// Seed of the generated case before shrinking.
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub shrunk: bool,
    /// Deduplication signature (kernel, class, axis fingerprint).
    #[serde(default)]
    pub signature: Option<String>,
    /// Seconds since the Unix epoch.
    #[serde(default)]
    pub created_unix: Option<u64>,
    #[serde(default)]
    pub note: Option<String>,
    /// The generator recipe, when the case was generated.
    #[serde(default)]
    pub recipe: Option<serde_json::Value>,
}

/// What replaying the case is expected to show.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// Finding classes the original kernel produced; empty for a clean seed case.
    #[serde(default)]
    pub classes: Vec<Class>,
}

/// A corpus file in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseFile {
    pub provenance: Provenance,
    pub expected: Expected,
    pub case: Case,
}

#[derive(Debug, thiserror::Error)]
#[error("{}: {field}: {message}", path.display())]
pub struct CaseFileError {
    pub path: PathBuf,
    pub field: String,
    pub message: String,
}

impl From<CaseFileError> for crate::error::Fatal {
    fn from(e: CaseFileError) -> Self {
        crate::error::Fatal::usage(e.to_string())
    }
}

fn ferr(path: &Path, field: impl Into<String>, message: impl Into<String>) -> CaseFileError {
    CaseFileError {
        path: path.to_path_buf(),
        field: field.into(),
        message: message.into(),
    }
}

/// A file's int64 table entries as the int32 every kernel reads; an entry that does not
/// fit is refused naming it.
fn table_entries(
    path: &Path,
    wide: impl Iterator<Item = i64>,
    row_stride: usize,
) -> Result<Vec<i32>, CaseFileError> {
    wide.enumerate()
        .map(|(k, e)| {
            i32::try_from(e).map_err(|_| {
                let w = row_stride.max(1);
                ferr(
                    path,
                    format!("case.block_table.entries[{}][{}]", k / w, k % w),
                    format!("{e} does not fit in int32"),
                )
            })
        })
        .collect()
}

// ---- JSON shape -------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    format_version: u32,
    #[serde(default)]
    provenance: Provenance,
    #[serde(default)]
    expected: Expected,
    case: CaseJson,
}

/// The case: its shape's fields first, then the cache, the lengths, the table and the
/// tensors, all at one level.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseJson {
    #[serde(flatten)]
    shape: Shape,
    num_blocks: u64,
    kv_block_stride: u64,
    max_model_len: usize,
    out_row_stride: usize,
    context_lens: ContextLens,
    block_table: BlockTableJson,
    tensors: TensorsJson,
}

/// The block table in the JSON: its `entries` inline up to [`TABLE_INLINE_MAX`], else
/// in the sibling safetensors file (tensor `block_table`, I64 `[B, row_stride]`): an
/// engine-sized table (millions of entries at block size 1) would make the JSON tens of
/// megabytes.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockTableJson {
    max_blocks: usize,
    row_stride: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    entries: Option<Vec<i64>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum TensorsJson {
    /// Small tensors in the JSON itself.
    Inline {
        /// fp8 codes `[B,N,H,D]` as hex.
        q: String,
        /// `[B*N, H]`; numbers, or strings `nan`/`inf`/`-inf`/`0x7fc00001` for bit patterns.
        weights: Vec<F32Json>,
        /// Block id → block bytes as hex (`bs*D` codes then `bs` little-endian f32 scales).
        kv_blocks: BTreeMap<String, String>,
    },
    /// A sibling safetensors file holding `q` (U8 `[B,N,H,D]`), `weights` (F32
    /// `[B*N,H]`), `kv_block_ids` (I64 `[n]`) and `kv_blocks` (U8 `[n, bs*(D+4)]`);
    /// and `block_table` (I64 `[B, row_stride]`) when the JSON's table has no entries.
    Safetensors(String),
}

// ---- Load -------------------------------------------------------------------------

/// Reads, parses and validates a corpus file (and its safetensors sibling).
pub fn load_case_file(path: &Path) -> Result<CaseFile, CaseFileError> {
    let meta = std::fs::metadata(path).map_err(|e| ferr(path, "file", e.to_string()))?;
    if meta.len() > MAX_JSON_BYTES {
        return Err(ferr(
            path,
            "file",
            format!(
                "{} bytes is above the {MAX_JSON_BYTES}-byte limit",
                meta.len()
            ),
        ));
    }
    let text = std::fs::read(path).map_err(|e| ferr(path, "file", e.to_string()))?;
    parse_case(path, &text, &mut |st_path: &Path| read_tensor_file(st_path))
}

/// Parses and validates a corpus file already in memory: `json` is the file, `tensors`
/// the sibling safetensors file when the JSON names one. `path` only names the file in
/// errors. Loading from disk goes through here too, so fuzzing this function covers
/// every check [`load_case_file`] makes after reading the bytes.
pub fn load_case_bytes(
    path: &Path,
    json: &[u8],
    tensors: Option<&[u8]>,
) -> Result<CaseFile, CaseFileError> {
    parse_case(path, json, &mut |st_path: &Path| {
        tensors
            .map(<[u8]>::to_vec)
            .ok_or_else(|| ferr(st_path, "file", "no tensor file given"))
    })
}

/// Reads a sibling safetensors file, refusing absurd sizes before reading.
fn read_tensor_file(path: &Path) -> Result<Vec<u8>, CaseFileError> {
    let meta = std::fs::metadata(path).map_err(|e| ferr(path, "file", e.to_string()))?;
    if meta.len() > MAX_TENSOR_BYTES {
        return Err(ferr(
            path,
            "file",
            format!(
                "{} bytes is above the {MAX_TENSOR_BYTES}-byte limit",
                meta.len()
            ),
        ));
    }
    std::fs::read(path).map_err(|e| ferr(path, "file", e.to_string()))
}

type TensorSource<'a> = dyn FnMut(&Path) -> Result<Vec<u8>, CaseFileError> + 'a;

fn parse_case(
    path: &Path,
    text: &[u8],
    tensors: &mut TensorSource,
) -> Result<CaseFile, CaseFileError> {
    if text.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ferr(path, "file", "is empty"));
    }
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ferr(
            path,
            "json",
            "a corpus file must hold one JSON object ({ ... })",
        ));
    }
    // Check the version before the full parse, so an unknown version gets a clear
    // message instead of a field error from a format we do not know.
    #[derive(Deserialize)]
    struct VersionOnly {
        format_version: Option<serde_json::Value>,
    }
    if let Ok(v) = serde_json::from_slice::<VersionOnly>(text) {
        match v.format_version {
            None => return Err(ferr(path, "format_version", "is missing")),
            Some(serde_json::Value::Number(n)) if n.as_u64() == Some(FORMAT_VERSION as u64) => {}
            Some(other) => {
                return Err(ferr(
                    path,
                    "format_version",
                    format!(
                        "{other} is not supported (this mqa-fuzz reads version {FORMAT_VERSION})"
                    ),
                ))
            }
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(text);
    let parsed: FileJson = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        if field == "case" {
            if let Some((field, msg)) = shape_field_error(text) {
                return ferr(path, field, msg);
            }
        }
        let msg = if inner.is_eof() {
            format!("file is truncated ({inner})")
        } else {
            inner.to_string()
        };
        ferr(
            path,
            if field == "." {
                "json".to_string()
            } else {
                field
            },
            msg,
        )
    })?;
    let case = case_from_json(path, parsed.case, tensors)?;
    case.validate()
        .map_err(|e| ferr(path, format!("case.{}", e.field), e.message))?;
    Ok(CaseFile {
        provenance: parsed.provenance,
        expected: parsed.expected,
        case,
    })
}

/// The shape field a bad value stands in, and why. `#[serde(flatten)]` reads the
/// shape's fields after the whole `case` object, out of the path tracker's sight, so a
/// wrong `case.heads` is reported at `case`; reading the shape alone from the parsed
/// file names the field again. `None` when the shape is not what failed.
fn shape_field_error(text: &[u8]) -> Option<(String, String)> {
    let file: serde_json::Value = serde_json::from_slice(text).ok()?;
    let e = serde_path_to_error::deserialize::<_, Shape>(file.get("case")?).err()?;
    let field = e.path().to_string();
    (field != ".").then(|| (format!("case.{field}"), e.into_inner().to_string()))
}

fn case_from_json(
    path: &Path,
    c: CaseJson,
    tensors: &mut TensorSource,
) -> Result<Case, CaseFileError> {
    let table_in_tensors = c.block_table.entries.is_none();
    let mut case = Case {
        shape: c.shape,
        num_blocks: c.num_blocks,
        kv_block_stride: c.kv_block_stride,
        context_lens: c.context_lens,
        block_table: BlockTable::whole(
            c.block_table.max_blocks,
            c.block_table.row_stride,
            table_entries(
                path,
                c.block_table.entries.unwrap_or_default().into_iter(),
                c.block_table.row_stride,
            )?,
        ),
        max_model_len: c.max_model_len,
        out_row_stride: c.out_row_stride,
        q: Vec::new(),
        weights: Vec::new(),
        kv: SparseKvCache::default(),
    };
    // Shape limits first: nothing below allocates from an unchecked dimension.
    super::validate::validate_shape_dims(&case)
        .map_err(|e| ferr(path, format!("case.{}", e.field), e.message))?;
    let bb = case.shape.block_bytes();
    match c.tensors {
        TensorsJson::Inline { .. } if table_in_tensors => {
            return Err(ferr(
                path,
                "case.block_table.entries",
                "missing (a table outside the JSON lives in the safetensors file, and this case has none)",
            ));
        }
        TensorsJson::Inline {
            q,
            weights,
            kv_blocks,
        } => {
            case.q = from_hex(&q).map_err(|m| ferr(path, "case.tensors.inline.q", m))?;
            case.weights = weights.into_iter().map(|w| w.0).collect();
            for (k, v) in kv_blocks {
                let id: u64 = k.parse().map_err(|_| {
                    ferr(
                        path,
                        format!("case.tensors.inline.kv_blocks.{k}"),
                        "block id is not a non-negative integer",
                    )
                })?;
                let bytes = from_hex(&v)
                    .map_err(|m| ferr(path, format!("case.tensors.inline.kv_blocks.{k}"), m))?;
                if bytes.len() != bb {
                    return Err(ferr(
                        path,
                        format!("case.tensors.inline.kv_blocks.{k}"),
                        format!("has {} bytes, block_size*(head_dim+4) is {bb}", bytes.len()),
                    ));
                }
                if case.kv.insert(id, bytes).is_some() {
                    return Err(ferr(
                        path,
                        format!("case.tensors.inline.kv_blocks.{k}"),
                        format!("block {id} is given twice"),
                    ));
                }
            }
        }
        TensorsJson::Safetensors(rel) => {
            let st_path = sibling(path, &rel).ok_or_else(|| {
                ferr(
                    path,
                    "case.tensors.safetensors",
                    format!("{rel:?} must be a plain file name beside the JSON"),
                )
            })?;
            // Name the JSON file (what the user passed) and the tensor file with its field.
            let loaded = tensors(&st_path)
                .and_then(|bytes| load_tensors(&st_path, &bytes, &mut case, table_in_tensors));
            loaded.map_err(|e| {
                ferr(
                    path,
                    format!(
                        "case.tensors.safetensors ({}) {}",
                        st_path.display(),
                        e.field
                    ),
                    e.message,
                )
            })?;
        }
    }
    Ok(case)
}

fn sibling(json_path: &Path, rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    if p.components().count() != 1 || p.is_absolute() || rel.contains("..") {
        return None;
    }
    Some(json_path.parent().unwrap_or(Path::new(".")).join(p))
}

fn load_tensors(
    path: &Path,
    bytes: &[u8],
    case: &mut Case,
    with_table: bool,
) -> Result<(), CaseFileError> {
    use safetensors::{Dtype, SafeTensors};
    let st = SafeTensors::deserialize(bytes).map_err(|e| ferr(path, "header", e.to_string()))?;
    let get = |name: &str, dtype: Dtype| -> Result<(Vec<usize>, &[u8]), CaseFileError> {
        let t = st
            .tensor(name)
            .map_err(|_| ferr(path, name, "tensor is missing"))?;
        if t.dtype() != dtype {
            return Err(ferr(
                path,
                name,
                format!("dtype is {:?}, expected {dtype:?}", t.dtype()),
            ));
        }
        Ok((t.shape().to_vec(), t.data()))
    };
    let s = case.shape.clone();
    let (shape, q) = get("q", Dtype::U8)?;
    if shape != [s.batch, s.next_n, s.heads, s.head_dim] {
        return Err(ferr(
            path,
            "q",
            format!(
                "shape {shape:?}, expected [{}, {}, {}, {}]",
                s.batch, s.next_n, s.heads, s.head_dim
            ),
        ));
    }
    case.q = q.to_vec();
    let (shape, w) = get("weights", Dtype::F32)?;
    if shape != [s.rows(), s.heads] {
        return Err(ferr(
            path,
            "weights",
            format!("shape {shape:?}, expected [{}, {}]", s.rows(), s.heads),
        ));
    }
    case.weights = w
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    if with_table {
        let t = &mut case.block_table;
        let (shape, e) = get("block_table", Dtype::I64)?;
        if shape != [s.batch, t.row_stride] {
            return Err(ferr(
                path,
                "block_table",
                format!(
                    "shape {shape:?}, expected [{}, {}] (batch, case.block_table.row_stride)",
                    s.batch, t.row_stride
                ),
            ));
        }
        let wide = e
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()));
        t.entries = table_entries(path, wide, t.row_stride)?;
    }
    let (id_shape, ids) = get("kv_block_ids", Dtype::I64)?;
    let (blk_shape, blks) = get("kv_blocks", Dtype::U8)?;
    let n = *id_shape.first().unwrap_or(&0);
    if id_shape.len() != 1 || blk_shape != [n, s.block_bytes()] {
        return Err(ferr(
            path,
            "kv_blocks",
            format!(
                "shape {blk_shape:?} with {id_shape:?} ids, expected [{n}, {}]",
                s.block_bytes()
            ),
        ));
    }
    for (k, id) in ids.chunks_exact(8).enumerate() {
        let id = i64::from_le_bytes(id.try_into().unwrap());
        if id < 0 {
            return Err(ferr(
                path,
                format!("kv_block_ids[{k}]"),
                format!("{id} is negative"),
            ));
        }
        let bb = s.block_bytes();
        if case
            .kv
            .insert(id as u64, blks[k * bb..(k + 1) * bb].to_vec())
            .is_some()
        {
            return Err(ferr(
                path,
                format!("kv_block_ids[{k}]"),
                format!("block {id} is given twice"),
            ));
        }
    }
    Ok(())
}

// ---- Save -------------------------------------------------------------------------

/// Writes `path` (JSON) and, when the tensors are large, `<stem>.safetensors` beside
/// it. Both are written atomically (temporary file, then rename), tensors first, so a
/// reader never sees a JSON file whose tensors are missing or half-written.
pub fn save_case_file(path: &Path, file: &CaseFile) -> std::io::Result<()> {
    let c = &file.case;
    let tensor_bytes = c.q.len() + 4 * c.weights.len() + c.kv.len() * c.shape.block_bytes();
    let table_inline = c.block_table.len() <= TABLE_INLINE_MAX;
    let tensors = if tensor_bytes <= INLINE_LIMIT && table_inline {
        TensorsJson::Inline {
            q: to_hex(&c.q),
            weights: c.weights.iter().map(|&w| F32Json(w)).collect(),
            kv_blocks: c
                .kv
                .iter()
                .map(|(id, b)| (id.to_string(), to_hex(b)))
                .collect(),
        }
    } else {
        let st_name = format!(
            "{}.safetensors",
            path.file_stem().and_then(|s| s.to_str()).unwrap_or("case")
        );
        let st_path = path.with_file_name(&st_name);
        crate::util::write_atomic(&st_path, &tensors_to_safetensors(c, !table_inline)?)?;
        TensorsJson::Safetensors(st_name)
    };
    let json = FileJson {
        format_version: FORMAT_VERSION,
        provenance: file.provenance.clone(),
        expected: file.expected.clone(),
        case: CaseJson {
            shape: c.shape.clone(),
            num_blocks: c.num_blocks,
            kv_block_stride: c.kv_block_stride,
            max_model_len: c.max_model_len,
            out_row_stride: c.out_row_stride,
            context_lens: c.context_lens.clone(),
            block_table: BlockTableJson {
                max_blocks: c.block_table.max_blocks,
                row_stride: c.block_table.row_stride,
                entries: table_inline.then(|| {
                    c.block_table
                        .whole_entries()
                        .iter()
                        .map(|&e| e.into())
                        .collect()
                }),
            },
            tensors,
        },
    };
    let mut text = serde_json::to_vec_pretty(&json).map_err(std::io::Error::other)?;
    text.push(b'\n');
    crate::util::write_atomic(path, &text)
}

/// The case's tensors as a safetensors blob (names as in [`TensorsJson::Safetensors`]),
/// with the block table too when `with_table`.
pub fn tensors_to_safetensors(c: &Case, with_table: bool) -> std::io::Result<Vec<u8>> {
    use safetensors::{tensor::TensorView, Dtype};
    let s = &c.shape;
    let w: Vec<u8> = c.weights.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ids: Vec<u8> =
        c.kv.ids()
            .into_iter()
            .flat_map(|id| (id as i64).to_le_bytes())
            .collect();
    let blks: Vec<u8> = c.kv.iter().flat_map(|(_, b)| b).copied().collect();
    let table: Vec<u8> = if with_table {
        c.block_table
            .whole_entries()
            .iter()
            .flat_map(|&e| i64::from(e).to_le_bytes())
            .collect()
    } else {
        Vec::new()
    };
    let n = c.kv.len();
    let e = |e: safetensors::SafeTensorError| std::io::Error::other(e.to_string());
    let mut views = vec![
        (
            "q",
            TensorView::new(
                Dtype::U8,
                vec![s.batch, s.next_n, s.heads, s.head_dim],
                &c.q,
            )
            .map_err(e)?,
        ),
        (
            "weights",
            TensorView::new(Dtype::F32, vec![s.rows(), s.heads], &w).map_err(e)?,
        ),
        (
            "kv_block_ids",
            TensorView::new(Dtype::I64, vec![n], &ids).map_err(e)?,
        ),
        (
            "kv_blocks",
            TensorView::new(Dtype::U8, vec![n, s.block_bytes()], &blks).map_err(e)?,
        ),
    ];
    if with_table {
        let shape = vec![s.batch, c.block_table.row_stride];
        views.push((
            "block_table",
            TensorView::new(Dtype::I64, shape, &table).map_err(e)?,
        ));
    }
    safetensors::serialize(views, None).map_err(e)
}
