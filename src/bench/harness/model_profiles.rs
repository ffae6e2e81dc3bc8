//! The profile-change phase driven by a declared model: the same users,
//! posts and profile changes as [`Bench::profiles_phase`], sent as
//! commands of `models/files-and-posts.toml` (the model that declares the
//! compiled-in domain) and applied by a worker running that model, so that
//! the generic code is measured on the work the compiled-in code does in
//! the same run. On a topic and an index of their own: an index holds one
//! model.

use serde_json::{json, Map, Value};

use super::profiles::{post_updates, profile_changes, users_with_posts, POSTS_PER_USER};
use super::table::{per_sec, phase, Row};
use super::Bench;
use denorm::command::generic::legacy;
use denorm::command::{Command, Envelope};
use denorm::domain::Domain;
use denorm::produce::Producer;

/// `commands` as the same commands of `model`.
fn as_model(model: &'static Domain, commands: Vec<Command>) -> Vec<Command> {
    commands.into_iter().map(|c| legacy::command_of(model, &Envelope::new(c))).collect()
}

impl Bench<'_> {
    /// Profile changes through the model against post upserts through the
    /// model, each caught up by a fresh worker, beside the compiled-in
    /// phase's figures (`results["profile_changes"]`, measured before).
    pub(super) async fn model_profiles_phase(&self, run_id: &str, es_url: Option<&str>, rows: &mut Vec<Row>, results: &mut Map<String, Value>) -> anyhow::Result<()> {
        let users = self.a.profile_users as usize;
        if users == 0 {
            return Ok(());
        }
        let file = self.work.join("files-and-posts.toml");
        std::fs::write(&file, legacy::TEXT)?;
        let model = legacy::domain();
        let (b, index) = self.own_topic("model", run_id, es_url, self.a.partitions, Some(&file)).await?;
        let group = format!("denorm-bench-{run_id}-model");
        let producer = Producer::new(&b.kafka)?.with_model(model);
        let posts = users * POSTS_PER_USER;
        phase(&format!("model profile changes: loading {users} users with {POSTS_PER_USER} posts each as commands of model {}", model.name));
        let worker = b.start_worker(&group, &index).await?;
        producer.send_all(as_model(model, users_with_posts(users)), 10_000, |_| {}).await?;
        b.wait_applied(&worker, &index, None).await?;
        phase(&format!("model profile changes: baseline, {posts} post upserts of the model caught up by a fresh worker"));
        worker.stop().await?;
        producer.send_all(as_model(model, post_updates(users)), 10_000, |_| {}).await?;
        let (worker, took, cpu_single) = b.catch_up(&group, &index, "the model's post upserts").await?;
        let single = posts as f64 / took.as_secs_f64();
        phase(&format!("model profile changes: {users} profile changes of the model caught up by a fresh worker"));
        worker.stop().await?;
        producer.send_all(as_model(model, profile_changes(users, 1)), 10_000, |_| {}).await?;
        let (worker, took, cpu) = b.catch_up(&group, &index, "the model's profile changes").await?;
        worker.stop().await?;
        let rate = users as f64 / took.as_secs_f64();
        rows.push(Row::new(
            format!("{users} profile changes through model {}", model.name),
            format!("{} ({} posts/s)", per_sec(rate, "commands"), per_sec(rate * POSTS_PER_USER as f64, "")),
            format!("its post upserts {}", per_sec(single, "commands")),
            Some(rate / single),
            ">= 50%",
        ));
        let compiled_in = results.get("profile_changes").cloned().unwrap_or_default();
        let against = |k: &str| compiled_in[k].as_f64();
        results.insert(
            "model_profile_changes".into(),
            json!({
                "model": model.name, "users": users, "posts_per_user": POSTS_PER_USER, "seconds": took.as_secs_f64(), "rate": rate,
                "single_document_rate": single, "ratio": rate / single, "cpu": cpu, "single_document_cpu": cpu_single,
                "compiled_in_rate": against("rate"), "compiled_in_single_document_rate": against("single_document_rate"),
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_sends_the_compiled_in_phases_commands_as_the_models_under_the_same_keys() {
        let model = legacy::domain();
        let load = users_with_posts(3);
        let sent = as_model(model, load.clone());
        assert_eq!(sent.len(), load.len());
        for (c, m) in load.iter().zip(&sent) {
            let Command::Model(b) = m else { panic!("{m:?} is not a model command") };
            assert_eq!((m.key(), m.validate().is_ok()), (c.key(), true), "{c:?} as {b:?}");
        }
    }
}
