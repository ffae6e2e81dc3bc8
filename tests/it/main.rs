//! The integration tests, one binary (one link instead of one per file),
//! one module per area. Most run against real servers: a tansu broker of
//! their own (or `DENORM_TEST_BROKERS`) and the Elasticsearch-API server
//! (`DENORM_ES_URL`) that `scripts/test.sh` starts; `common` holds the
//! shared helpers (worker processes, produce/wait/dump, `eventually`).

mod common;

mod bench;
mod chaos;
mod cli;
mod consistency;
mod deploy;
mod diagnostics;
mod elastic_contracts;
mod faults;
mod interop;
mod layering;
mod log_identity;
mod membership;
mod meta_shards;
mod model_apply;
mod model_consistency;
mod model_pipeline;
mod model_placements;
mod model_rebuild;
mod model_schema;
mod model_search;
mod moves;
mod pipeline;
mod placements;
mod progress;
mod rebuild;
mod recorded_topic;
mod registry_contracts;
mod scenarios;
mod signing;
mod soak;
mod tenants;
mod topics;
mod transport;
mod verify;
mod verify_fooled;
mod verify_log;
mod verify_repairs;
mod verify_settings;
