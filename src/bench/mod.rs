//! `denorm bench`'s library parts (the CLI runs the phases).

pub mod process;
