//! Model graphs written once against the Backend trait: the target decoder, the DFlash/DSpark
//! drafters, their configs, and random-weight checkpoint writers.

pub mod config;
pub mod draft_vocab;
pub mod drafter;
pub mod layer;
pub mod reduce;
pub mod synth;
pub mod target;
