//! The invariants of a queue's flow control keys (see `src/lua/flow.lua`), checked whole
//! from outside, as the in-memory state machine's `Flow::check` checks its own: every item
//! the queue holds has its group, every ready item is in its group's list at its priority
//! once, the counts match the lists and the leases, the rings hold one entry per group and
//! priority, and no group that may hand out is missing from a ring where it has items.
//! For tests: it reads every key of the queue.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use redis::AsyncCommands;

/// Checks the flow control keys of queue `name` (prefix `wq`) on the server at `url`.
pub(crate) async fn check(url: &str, name: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let base = format!("wq:{{{name}}}:");
    let key = |suffix: &str| format!("{base}{suffix}");
    let e = |e: redis::RedisError| e.to_string();

    let settings: HashMap<String, String> = con.hgetall(key("flow")).await.map_err(e)?;
    if settings.is_empty() {
        return Err(format!("{name}: no flow settings"));
    }
    let limit_of = |g: &str| -> Option<usize> {
        settings
            .get(&format!("l:{g}"))
            .or(settings.get("pg"))
            .map(|n| n.parse().unwrap())
    };
    let groups_of: HashMap<String, String> = con.hgetall(key("fgr")).await.map_err(e)?;
    let dirty: BTreeSet<String> = con.smembers(key("dirty")).await.map_err(e)?;
    let proc: Vec<String> = con.zrange(key("proc"), 0, -1).await.map_err(e)?;
    let delay: Vec<String> = con.zrange(key("delay"), 0, -1).await.map_err(e)?;
    let prio: HashMap<String, i64> = con.hgetall(key("prio")).await.map_err(e)?;
    let proc_set: BTreeSet<&String> = proc.iter().collect();

    // Every item the queue holds has a group, and no other item does.
    let held: BTreeSet<&String> = dirty.iter().chain(&proc).chain(&delay).collect();
    let grouped: BTreeSet<&String> = groups_of.keys().collect();
    if held != grouped {
        return Err(format!(
            "{name}: held items {held:?}, items with a group {grouped:?}"
        ));
    }
    let ready: BTreeSet<&String> = dirty.iter().filter(|x| !proc_set.contains(x)).collect();

    // The plain ready lists are empty.
    let plain: usize = con.llen(key("ready")).await.map_err(e)?;
    let lanes: usize = con.zcard(key("lanes")).await.map_err(e)?;
    if plain + lanes > 0 {
        return Err(format!(
            "{name}: plain ready lists in use ({plain}, {lanes} lanes)"
        ));
    }

    // Every group hash of the queue.
    let mut hashes: Vec<String> = Vec::new();
    let mut iter: redis::AsyncIter<'_, String> =
        con.scan_match(format!("{base}fg:*")).await.map_err(e)?;
    while let Some(k) = iter.next_item().await {
        hashes.push(k.map_err(e)?);
    }
    drop(iter);
    let fready: Vec<(String, f64)> = con
        .zrange_withscores(key("fready"), 0, -1)
        .await
        .map_err(e)?;
    let fready: BTreeMap<String, f64> = fready.into_iter().collect();
    let fidle: Vec<String> = con.zrange(key("fidle"), 0, -1).await.map_err(e)?;
    let fpark: Vec<String> = con.zrange(key("fpark"), 0, -1).await.map_err(e)?;
    let fsat: BTreeSet<String> = con.smembers(key("fsat")).await.map_err(e)?;
    let frt: HashMap<String, String> = con.hgetall(key("frt")).await.map_err(e)?;
    let n: Option<usize> = con.hget(key("fstate"), "n").await.map_err(e)?;

    let mut queued_seen: BTreeSet<String> = BTreeSet::new();
    let mut entries_wanted: BTreeSet<(i64, String)> = BTreeSet::new();
    let mut must_ring: BTreeSet<(i64, String)> = BTreeSet::new();
    let mut saturated = BTreeSet::new();
    for hash in &hashes {
        let g = hash.strip_prefix(&format!("{base}fg:")).unwrap().to_owned();
        let h: HashMap<String, String> = con.hgetall(hash).await.map_err(e)?;
        let f: usize = h.get("f").map_or(0, |v| v.parse().unwrap());
        let leased = proc.iter().filter(|x| groups_of[*x] == g).count();
        if f != leased {
            return Err(format!(
                "{name}: group {g:?} counts {f} leases, has {leased}"
            ));
        }
        let parked = h.contains_key("k");
        let full = limit_of(&g).is_some_and(|l| f >= l);
        if full {
            saturated.insert(g.clone());
        }
        let mut count = 0;
        for field in h.keys() {
            if let Some(p) = field.strip_prefix("q:") {
                let p: i64 = p.parse().unwrap();
                let items: Vec<String> = con
                    .lrange(format!("{base}fq:{p}:{g}"), 0, -1)
                    .await
                    .map_err(e)?;
                if items.is_empty() {
                    return Err(format!("{name}: group {g:?} names an empty list at {p}"));
                }
                for x in items {
                    if groups_of.get(&x) != Some(&g) {
                        return Err(format!("{name}: {x:?} in group {g:?}'s list"));
                    }
                    if prio.get(&x).copied().unwrap_or(0) != p {
                        return Err(format!("{name}: {x:?} in {g:?}'s list at {p}"));
                    }
                    if !ready.contains(&x) || !queued_seen.insert(x.clone()) {
                        return Err(format!("{name}: {x:?} listed but not ready, or twice"));
                    }
                    count += 1;
                }
                if !parked && !full {
                    must_ring.insert((p, g.clone()));
                }
            } else if let Some(p) = field.strip_prefix("r:") {
                entries_wanted.insert((p.parse().unwrap(), g.clone()));
            }
        }
        let score = fready.get(&g).copied();
        if (count > 0 || f > 0) != score.is_some() || score.unwrap_or(0.0) as usize != count {
            return Err(format!(
                "{name}: group {g:?} with {count} ready and {f} out has fready {score:?}"
            ));
        }
        if count == 0 && f == 0 && !parked && !h.keys().any(|k| k.starts_with("r:")) {
            // Kept for a refilling bucket only.
            if !fidle.contains(&g) {
                return Err(format!(
                    "{name}: group {g:?} holds nothing and is kept: {h:?}"
                ));
            }
        }
        if parked != fpark.contains(&g) {
            return Err(format!(
                "{name}: group {g:?} parked {parked}, in fpark {}",
                !parked
            ));
        }
    }
    if queued_seen.iter().collect::<BTreeSet<_>>() != ready {
        return Err(format!("{name}: ready {ready:?}, listed {queued_seen:?}"));
    }
    if n.unwrap_or(0) != ready.len() {
        return Err(format!("{name}: n = {n:?}, {} ready", ready.len()));
    }
    if frt.keys().collect::<BTreeSet<_>>() != ready {
        return Err(format!("{name}: ready times of {:?}", frt.keys()));
    }
    if fsat != saturated {
        return Err(format!(
            "{name}: fsat {fsat:?}, at their limit {saturated:?}"
        ));
    }
    for g in fready.keys() {
        if !hashes.contains(&format!("{base}fg:{g}")) {
            return Err(format!("{name}: {g:?} in fready without a hash"));
        }
    }

    // The rings: one entry per group and priority, each marked, every group that may hand
    // out present where it has items.
    let rings: Vec<i64> = con.zrange(key("frings"), 0, -1).await.map_err(e)?;
    let mut entries = BTreeSet::new();
    let mut ring_keys = Vec::new();
    let mut iter: redis::AsyncIter<'_, String> =
        con.scan_match(format!("{base}fr:*")).await.map_err(e)?;
    while let Some(k) = iter.next_item().await {
        ring_keys.push(k.map_err(e)?);
    }
    drop(iter);
    for ring in ring_keys {
        let p: i64 = ring.rsplit(':').next().unwrap().parse().unwrap();
        if !rings.contains(&p) {
            return Err(format!("{name}: ring {p} missing from frings"));
        }
        let members: Vec<String> = con.lrange(&ring, 0, -1).await.map_err(e)?;
        for g in members {
            if !entries.insert((p, g.clone())) {
                return Err(format!("{name}: {g:?} twice in ring {p}"));
            }
        }
    }
    if entries != entries_wanted {
        return Err(format!(
            "{name}: ring entries {entries:?}, marked {entries_wanted:?}"
        ));
    }
    if let Some(missing) = must_ring.difference(&entries).next() {
        return Err(format!(
            "{name}: {missing:?} may hand out and is in no ring"
        ));
    }
    Ok(())
}
