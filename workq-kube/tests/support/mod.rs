//! What the controller tests share: waiting for a state, ConfigMaps, a custom resource
//! with a status, and replicas sharing a queue on a server (`replicas`).

#![allow(dead_code, reason = "each test binary uses a part of the support")]

pub(crate) mod replicas;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

/// Waits until `done` holds, checking every 5 ms; fails after 30 s (a hang, not a timing
/// goal).
pub(crate) async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The process-wide registry's text.
#[cfg(feature = "prometheus")]
pub(crate) fn metrics() -> String {
    let mut text = String::new();
    workq_kube::metrics::encode(&mut text).unwrap();
    text
}

/// The value of the sample named `series` with exactly `labels` (in the scrape's order).
pub(crate) fn sample(text: &str, series: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{series}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| value.trim().parse().expect("a sample's value is a number"))
}

pub(crate) fn configmap(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

pub(crate) fn value_of(configmap: &ConfigMap) -> String {
    configmap
        .data
        .as_ref()
        .and_then(|data| data.get("value"))
        .cloned()
        .unwrap_or_default()
}

/// A custom resource, typed by hand (kube's derive would need its `derive` feature).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Widget {
    /// `example.com/v1`, as kube's `CustomResource` derive writes it.
    #[serde(rename = "apiVersion", default)]
    pub(crate) api_version: String,
    /// `Widget`.
    #[serde(default)]
    pub(crate) kind: String,
    pub(crate) metadata: ObjectMeta,
    pub(crate) spec: WidgetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<WidgetStatus>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct WidgetSpec {
    pub(crate) size: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WidgetStatus {
    pub(crate) message: String,
}

impl k8s_openapi::Resource for Widget {
    const API_VERSION: &'static str = "example.com/v1";
    const GROUP: &'static str = "example.com";
    const KIND: &'static str = "Widget";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "widgets";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Widget {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

pub(crate) fn widget(name: &str, size: u32) -> Widget {
    Widget {
        api_version: "example.com/v1".to_owned(),
        kind: "Widget".to_owned(),
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        spec: WidgetSpec { size },
        status: None,
    }
}

/// A watcher backoff that always waits the same short time, so that tests of failing
/// watchers do not wait for kube's 800 ms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Every(pub Duration);

impl Iterator for Every {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.0)
    }
}

impl kube::runtime::utils::Backoff for Every {
    fn reset(&mut self) {}
}
