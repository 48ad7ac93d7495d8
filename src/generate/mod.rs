//! Generation: proptest strategies over recipes, per profile, edge-biased toward the
//! places kernels have broken (DESIGN §3). A recipe materializes into a [`Case`].
//!
//! [`Case`]: crate::case::Case

pub mod engine;
pub mod epoch;
pub mod philox;
pub mod pool;
pub mod recipe;
pub mod strategy;
pub(crate) mod values;

pub use recipe::{
    Knobs, LensRecipe, OffsetClass, Padding, PoolRecipe, Recipe, TableOrder, ValueKind,
    COMPACT_TABLE_PADDING,
};
pub use strategy::{draw_strategy, Draw, Profile};
