//! A finding's picture is computed by the oracle's element scan
//! ([`crate::oracle::picture`]) when the finding is made; the report renders it
//! ([`super::svg`], [`super::html`]). Re-exported here for the renderers.

pub use crate::oracle::picture::{
    class_map, draw, error_histogram, histogram_bin, CellClass, ClassMap, FIRST_OUT_OF_BOUND_BIN,
    HISTOGRAM_BINS, MAX_CELL_COLS, MAX_CELL_ROWS, NON_FINITE_BIN,
};
