//! `denorm bench`: its phases against raw baselines ([`harness`]) and the
//! process probes they report with ([`process`]); the CLI maps its flags.

pub mod harness;
pub mod process;
