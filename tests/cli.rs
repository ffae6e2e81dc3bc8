//! Command-line behaviour that needs no broker.

use std::process::Command;

fn denorm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_denorm"))
}

#[test]
fn help_never_shows_secrets_from_the_environment() {
    for args in [&["--help"][..], &["run", "--help"][..], &["produce", "--help"][..]] {
        let out = denorm().args(args).env("DENORM_KAFKA_OPTIONS", "sasl.password=hunter2").output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--kafka-option"), "{text}");
        assert!(!text.contains("hunter2"), "{args:?} shows the secret:\n{text}");
    }
}

#[test]
fn metrics_listener_defaults_to_loopback() {
    let out = denorm().args(["run", "--help"]).env_remove("DENORM_METRICS_ADDR").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[default: 127.0.0.1:9464]"), "{text}");
}

#[test]
fn usage_errors_exit_with_status_2() {
    assert_eq!(denorm().args(["produce", "rename", "--from", "/a/b"]).output().unwrap().status.code(), Some(2));
    assert_eq!(denorm().args(["nope"]).output().unwrap().status.code(), Some(2));
    assert_eq!(denorm().args(["-X", "no-equals-sign", "lag"]).output().unwrap().status.code(), Some(2));
}
