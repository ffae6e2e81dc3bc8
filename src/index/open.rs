//! The choice of backend from `--index`, made here once for every command:
//! an `http(s)://` URL is Elasticsearch, anything else an embedded index
//! directory. Each command says what it does with the index, and gets the
//! interface that needs (a live backend, generations, a search).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::runtime::Handle;

use super::elastic::backend::ElasticBackend;
use super::elastic::config::ElasticConfig;
use super::elastic::placement::Placement;
use super::elastic::search::ElasticSearch;
use super::elastic::setup;
use super::embedded::{EmbeddedBackend, EmbeddedIndex};
use super::generations::{ElasticGenerations, EmbeddedGenerations, Generations};
use super::recorded_model::Decision;
use super::tenant_generations::TenantGenerations;
use super::{Backend, IndexError, SearchIndex};

/// Where the index is.
#[derive(Debug, Clone)]
pub enum Location {
    /// An embedded index directory.
    Embedded(PathBuf),
    /// An Elasticsearch cluster (credentials from `DENORM_ES_*`).
    Elastic(Box<ElasticConfig>),
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `--index` or the `DENORM_ES_*` settings are not usable as given.
    #[error("{0}")]
    Settings(String),
    /// The index named is not there, or cannot be opened or set up.
    #[error("opening the index {what}: {source}")]
    Open {
        what: String,
        #[source]
        source: IndexError,
    },
}

/// How a live backend is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// To apply commands (`denorm run`): an embedded index is created when
    /// missing; Elasticsearch's indexes are set up.
    Apply,
    /// To read and repair what is there (`denorm verify`): the index must
    /// exist; nothing is created.
    Existing,
}

/// The embedded index's tuning (ignored by Elasticsearch), and the model
/// the index holds (both backends).
#[derive(Debug, Clone, Copy)]
pub struct Embedded {
    /// Indexing memory of each shard writer, in bytes.
    pub memory: usize,
    /// See [`EmbeddedBackend::fan_out_commit_every`] (`None`: its default).
    pub fan_out_commit_every: Option<u64>,
    /// See [`EmbeddedBackend::merge_max_docs`] (`None`: its default).
    pub merge_max_docs: Option<u32>,
    /// The declared model whose documents the index holds
    /// ([`EmbeddedIndex::with_model`], [`ElasticBackend::model`]).
    pub model: Option<&'static crate::domain::Domain>,
}

impl Embedded {
    pub fn with_memory(memory: usize) -> Self {
        Embedded { memory, fan_out_commit_every: None, merge_max_docs: None, model: None }
    }
}

fn is_url(index: &str) -> bool {
    index.starts_with("http://") || index.starts_with("https://")
}

impl Location {
    /// What `--index` names: an `http://` or `https://` URL is
    /// Elasticsearch, with its credentials read from `DENORM_ES_*`;
    /// anything else is an embedded index directory.
    pub fn parse(index: &Path) -> Result<Location, OpenError> {
        Self::parse_with(index, |k| std::env::var(k).ok())
    }

    /// [`Location::parse`] with the environment given (tests).
    pub fn parse_with(index: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Location, OpenError> {
        let text = index.to_string_lossy();
        if !is_url(&text) {
            return Ok(Location::Embedded(index.to_path_buf()));
        }
        ElasticConfig::from_lookup(&text, env).map(|c| Location::Elastic(Box::new(c))).map_err(|e| OpenError::Settings(e.to_string()))
    }

    /// Whether `--index` names Elasticsearch, without reading its settings.
    pub fn names_elastic(index: &Path) -> bool {
        is_url(&index.to_string_lossy())
    }

    fn failed(&self, source: impl Into<IndexError>) -> OpenError {
        let what = match self {
            Location::Embedded(dir) => dir.display().to_string(),
            Location::Elastic(es) => es.url.to_string(),
        };
        OpenError::Open { what, source: source.into() }
    }

    /// The live index, to apply commands to or to read and repair.
    pub async fn backend(&self, topic: &str, access: Access, tuning: Embedded) -> Result<Arc<dyn Backend>, OpenError> {
        Ok(match self {
            Location::Elastic(es) => {
                let client = es.client().map_err(|e| self.failed(e))?;
                // Refused before anything is created: another model than
                // the one the indexes hold.
                let decision = setup::model_decision(&client, &es.prefix, tuning.model, access == Access::Apply).await.map_err(|e| self.failed(e))?;
                if access == Access::Apply {
                    setup::ensure(&client, &es.prefix, es.meta_shards, &Placement::new(es.dedicated.clone()), tuning.model).await.map_err(|e| self.failed(e))?;
                    if let (Decision::Record(_), Some(model)) = (decision, tuning.model) {
                        let g = super::elastic::generations::current(&client, &es.prefix).await.map_err(|e| self.failed(e))?;
                        setup::record_model(&client, &es.prefix, g, model).await.map_err(|e| self.failed(e))?;
                    }
                    tracing::info!(url = %es.url, prefix = %es.prefix, "elasticsearch indexes ready");
                }
                let mut backend = ElasticBackend::new(client, &es.prefix, topic, Handle::current());
                backend.configured = Placement::new(es.dedicated.clone());
                backend.model = tuning.model;
                Arc::new(backend)
            }
            Location::Embedded(dir) => {
                let index = match access {
                    Access::Apply => EmbeddedIndex::open(dir, topic),
                    Access::Existing => EmbeddedIndex::open_existing(dir),
                }
                .map_err(|e| self.failed(e))?
                .with_model(tuning.model);
                // A writer records its model in a generation that has none
                // yet; a reader is refused one written with another model.
                index.check_current_model(access == Access::Apply).map_err(|e| self.failed(e))?;
                let mut backend = EmbeddedBackend::new(index, tuning.memory);
                backend.fan_out_commit_every = tuning.fan_out_commit_every.unwrap_or(backend.fan_out_commit_every);
                backend.merge_max_docs = tuning.merge_max_docs.unwrap_or(backend.merge_max_docs);
                Arc::new(backend)
            }
        })
    }

    /// The index's generations (`denorm rebuild`). `manage`: it will create
    /// a generation and cut over, so Elasticsearch's indexes are set up and
    /// the credentials' privileges to manage them checked first. `model`:
    /// what the generation a rebuild builds holds (the live one may hold
    /// another: the rebuild decides, [`Generations::model_record`]).
    pub async fn generations(&self, topic: &str, manage: bool, memory: usize, model: Option<&'static crate::domain::Domain>) -> Result<Arc<dyn Generations>, OpenError> {
        Ok(match self {
            Location::Elastic(es) => {
                let client = es.client().map_err(|e| self.failed(e))?;
                if manage {
                    setup::ensure(&client, &es.prefix, es.meta_shards, &Placement::new(es.dedicated.clone()), None).await.map_err(|e| self.failed(e))?;
                    setup::check_privileges(&client, &es.prefix, setup::MANAGE_PRIVILEGES).await.map_err(|e| self.failed(e))?;
                }
                let mut backend = ElasticBackend::new(client, &es.prefix, topic, Handle::current());
                backend.configured = Placement::new(es.dedicated.clone());
                backend.model = model;
                Arc::new(ElasticGenerations::new(backend))
            }
            Location::Embedded(dir) => {
                let index = EmbeddedIndex::open_for_rebuild(dir, topic).map_err(|e| self.failed(e))?.with_model(model);
                Arc::new(EmbeddedGenerations { index, budget: memory })
            }
        })
    }

    /// One tenant's own indexes on Elasticsearch, revision by revision
    /// (`denorm rebuild --tenant`). `manage`: it will create indexes and
    /// move aliases. `model`: the one the generation holds (refused
    /// otherwise). `None` on the embedded index, which has one placement.
    pub async fn tenant_generations(
        &self,
        topic: &str,
        tenant: &str,
        (manage, to_shared): (bool, bool),
        model: Option<&'static crate::domain::Domain>,
    ) -> Result<Option<TenantGenerations>, OpenError> {
        let Location::Elastic(es) = self else { return Ok(None) };
        let client = es.client().map_err(|e| self.failed(e))?;
        if manage {
            setup::ensure(&client, &es.prefix, es.meta_shards, &Placement::new(es.dedicated.clone()), None).await.map_err(|e| self.failed(e))?;
            setup::check_privileges(&client, &es.prefix, setup::MANAGE_PRIVILEGES).await.map_err(|e| self.failed(e))?;
        }
        let mut backend = ElasticBackend::new(client, &es.prefix, topic, Handle::current());
        backend.model = model;
        // What decides whether a tenant in the shared indexes moves.
        backend.configured = Placement::new(es.dedicated.clone());
        let tenant = tenant.to_string();
        let opened = tokio::task::spawn_blocking(move || TenantGenerations::new(backend, &tenant, to_shared)).await.map_err(|e| self.failed(IndexError::Rejected(e.to_string())))?;
        match opened {
            Ok(t) => Ok(Some(t)),
            // The tenant has no indexes of its own: the operator's choice to fix.
            Err(IndexError::Rejected(why)) => Err(OpenError::Settings(why)),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// The index's current documents, to search (`denorm search`), read
    /// with `model` (refused when the index holds another).
    pub fn search(&self, runtime: Handle, model: Option<&'static crate::domain::Domain>) -> Result<Box<dyn SearchIndex>, OpenError> {
        Ok(match self {
            Location::Elastic(es) => {
                let client = es.client().map_err(|e| self.failed(e))?;
                // A search of the compiled-in kinds reads their indexes
                // alone, whatever model the others hold.
                if model.is_some() {
                    runtime.block_on(setup::model_decision(&client, &es.prefix, model, false)).map_err(|e| self.failed(e))?;
                }
                Box::new(ElasticSearch { client, prefix: es.prefix.clone(), runtime, generation: None, model })
            }
            Location::Embedded(dir) => Box::new(EmbeddedIndex::open_existing(dir).map(|i| i.with_model(model)).and_then(|i| i.search()).map_err(|e| self.failed(e))?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_elasticsearch_and_anything_else_a_directory() {
        let none = |_: &str| None;
        for dir in ["./data/index", "/var/lib/denorm", "http", "https-index", "index/http://x"] {
            assert!(!Location::names_elastic(Path::new(dir)), "{dir}");
            assert!(matches!(Location::parse_with(Path::new(dir), none).unwrap(), Location::Embedded(p) if p == Path::new(dir)), "{dir}");
        }
        for url in ["http://127.0.0.1:9200", "https://es.example:9200/"] {
            assert!(Location::names_elastic(Path::new(url)), "{url}");
            let Location::Elastic(es) = Location::parse_with(Path::new(url), none).unwrap() else { panic!("{url} is not Elasticsearch") };
            assert_eq!(es.url.as_str().trim_end_matches('/'), url.trim_end_matches('/'));
        }
    }

    #[test]
    fn bad_elasticsearch_settings_are_a_settings_error_and_a_missing_index_an_open_error() {
        let env = |k: &str| (k == "DENORM_ES_USERNAME").then(|| "u".to_string());
        let e = Location::parse_with(Path::new("http://127.0.0.1:9200"), env).unwrap_err();
        assert!(matches!(e, OpenError::Settings(_)), "{e:?}");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing-here");
        let e = Location::parse(&missing).unwrap().search(tokio::runtime::Runtime::new().unwrap().handle().clone(), None).err().unwrap();
        assert!(matches!(&e, OpenError::Open { what, .. } if what == &missing.display().to_string()), "{e:?}");
        assert!(!missing.exists(), "a search created the index");
    }
}
