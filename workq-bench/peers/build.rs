//! Reads the versions `Cargo.lock` pins for the peer crates, so that `describe` reports the
//! versions actually built (`PEER_VERSION_<crate>`).

fn main() {
    println!("cargo::rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").expect("Cargo.lock beside Cargo.toml");
    let lock: toml::Table = lock.parse().expect("a TOML lockfile");
    let packages = lock["package"].as_array().expect("[[package]] entries");
    for name in [
        "riverqueue",
        "bullmq-official",
        "apalis",
        "apalis-redis",
        "apalis-postgres",
    ] {
        let version = packages
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["version"].as_str())
            .unwrap_or("unknown");
        println!(
            "cargo::rustc-env=PEER_VERSION_{}={version}",
            name.replace('-', "_").to_uppercase()
        );
    }
}
