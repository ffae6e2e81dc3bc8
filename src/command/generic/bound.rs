//! A model's command as the worker carries it ([`crate::command::Command::Model`]):
//! with its model, its tenant, and its ordering keys scoped to the tenant,
//! so that everything the worker does with a command (keys, owner
//! changes, fan-outs, dead letters) it does with a model's.

use crate::command::{tenant, Command, Envelope};
use crate::domain::{Domain, Kind};

use super::value::Invalid;
use super::{ModelCommand, ModelEnvelope, Op};

#[derive(Debug, Clone)]
pub struct Bound {
    pub domain: &'static Domain,
    pub tenant: Option<String>,
    pub command: ModelCommand,
    /// The ordering key and an owner change's previous key, scoped; or why
    /// the command is not valid (it has no key then).
    keys: Result<Keys, Invalid>,
}

#[derive(Debug, Clone)]
struct Keys {
    key: String,
    previous: Option<String>,
}

impl PartialEq for Bound {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.domain, other.domain) && self.tenant == other.tenant && self.command == other.command
    }
}

// Floats of a command that is applied are finite (validation refuses the
// others), so equality is an equivalence on them.
impl Eq for Bound {}

impl Bound {
    /// Binds `command` of `tenant` to `domain`, checking it.
    pub fn new(domain: &'static Domain, tenant: Option<String>, command: ModelCommand) -> Self {
        let keys = Self::check(domain, tenant.as_deref(), &command);
        Bound { domain, tenant, command, keys }
    }

    fn check(domain: &Domain, t: Option<&str>, command: &ModelCommand) -> Result<Keys, Invalid> {
        if let Some(t) = t {
            tenant::validate(t).map_err(|e| Invalid::new("tenant", e.to_string()))?;
        }
        command.validate(domain)?;
        let kind = command.kind_in(domain)?;
        Ok(Keys { key: tenant::scope(t, command.key(kind)), previous: command.previous_key(kind).map(|p| tenant::scope(t, p)) })
    }

    /// The same command in another tenant.
    pub fn in_tenant(self, tenant: Option<&str>) -> Self {
        Bound::new(self.domain, tenant.map(str::to_string), self.command)
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        self.keys.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// The declaration of the command's kind. Valid commands only.
    pub fn decl(&self) -> &'static Kind {
        self.domain.kind(&self.command.kind).expect("a valid command names a kind of its model")
    }

    /// The ordering key, scoped ("" for a command that is not valid).
    pub fn key(&self) -> &str {
        self.keys.as_ref().map_or("", |k| k.key.as_str())
    }

    /// For an owner change: the key the document leaves, scoped.
    pub fn previous_key(&self) -> Option<&str> {
        self.keys.as_ref().ok().and_then(|k| k.previous.as_deref())
    }

    /// For an owner change: its first half, the delete under the key the
    /// document leaves.
    pub fn owner_change_delete(&self) -> Option<Bound> {
        self.previous_key()?;
        let delete = self.command.owner_change_delete(self.decl())?;
        Some(Bound::new(self.domain, self.tenant.clone(), delete))
    }

    /// Whether the command rewrites an unbounded number of documents: a
    /// rename of a prefix, an upsert or a patch of an owner whose copies
    /// other documents carry.
    pub fn is_fan_out(&self) -> bool {
        match &self.command.op {
            Op::RenamePrefix { .. } => true,
            Op::Upsert { .. } | Op::Patch { .. } => self.dependent_kinds() > 0,
            Op::Delete { .. } => false,
        }
    }

    /// How many kinds copy from this command's kind.
    pub fn dependent_kinds(&self) -> usize {
        self.domain.kinds.iter().filter(|k| k.copies.iter().any(|c| c.owner == self.command.kind)).count()
    }

    /// The command with what travels beside it, as a model's codec writes it.
    pub fn model_envelope(e: &Envelope) -> Option<ModelEnvelope> {
        let Command::Model(b) = &e.command else { return None };
        Some(ModelEnvelope {
            command_id: e.command_id.clone(),
            issued_at: e.issued_at,
            tenant: e.tenant.clone().or_else(|| b.tenant.clone()),
            after: e.after,
            repair: e.repair,
            command: b.command.clone(),
        })
    }

    /// The envelope of a model's command, as the worker carries it.
    pub fn envelope(domain: &'static Domain, e: ModelEnvelope) -> Envelope {
        let ModelEnvelope { command_id, issued_at, tenant, after, repair, command } = e;
        let bound = Bound::new(domain, tenant.clone(), command);
        Envelope { command_id, issued_at, tenant, after, repair, command: Command::Model(Box::new(bound)) }
    }
}
