//! denorm: a Kafka-driven, event-sourced indexing pipeline for denormalized
//! search documents. See README.md for the architecture.

pub mod alloc;
pub mod apply;
pub mod clock;
pub mod codec;
pub mod command;
pub mod demo;
pub mod dlq;
pub mod domain;
pub mod faults;
pub mod http;
pub mod index;
pub mod kafka;
pub mod logid;
pub mod members;
pub mod metrics;
pub mod migrate;
pub mod model;
pub mod moves;
pub mod produce;
pub mod rebuild;
pub mod retry;
pub mod secret;
pub mod signing;
pub mod verify;
pub mod worker;
