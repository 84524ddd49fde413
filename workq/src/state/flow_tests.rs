//! Tests of flow control in the state machine: unit tests of each rule, and a property test
//! against a sequential model (fairness, FIFO within a group, strict priorities, limits never
//! exceeded, and nothing held back that could be handed out).

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;

use super::flow::{Flow, FlowConfig, Rate};
use super::*;

const MS: u64 = 1_000_000;

fn queue(config: FlowConfig) -> State<String> {
    let mut state = State::new();
    state.enable_flow(Flow::new(config));
    state
}

fn grouped() -> State<String> {
    queue(FlowConfig::default())
}

fn group_of(item: &str) -> &str {
    item.split_once('/').map_or("", |(group, _)| group)
}

fn add(state: &mut State<String>, item: &str, priority: Option<i32>, now: u64) -> Added {
    state.flow_mut().unwrap().select(group_of(item), now);
    state.add(item.to_owned(), priority, now)
}

fn pop(state: &mut State<String>, now: u64) -> Option<(String, u32)> {
    let popped = state.pop(now).map(|p| (p.item, p.slot));
    state.check();
    popped
}

/// Pops everything poppable at `now`, marking each done at once.
fn drain(state: &mut State<String>, now: u64) -> Vec<String> {
    let mut out = Vec::new();
    while let Some((item, slot)) = pop(state, now) {
        out.push(item);
        state.done(slot, now);
        state.check();
    }
    out
}

#[test]
fn groups_take_turns_and_each_is_fifo() {
    let mut s = grouped();
    for i in 0..4 {
        add(&mut s, &format!("noisy/{i}"), None, 0);
    }
    add(&mut s, "a/0", None, 0);
    add(&mut s, "b/0", None, 0);
    add(&mut s, "a/1", None, 0);
    assert_eq!(s.len(), 7);
    assert_eq!(
        drain(&mut s, 0),
        [
            "noisy/0", "a/0", "b/0", "noisy/1", "a/1", "noisy/2", "noisy/3"
        ]
    );
    assert_eq!(s.tracked(), 0);
}

#[test]
fn priorities_stay_strict_across_groups() {
    let mut s = grouped();
    add(&mut s, "a/low", Some(-1), 0);
    add(&mut s, "b/zero", None, 0);
    add(&mut s, "a/high", Some(5), 0);
    add(&mut s, "c/high", Some(5), 0);
    assert_eq!(drain(&mut s, 0), ["a/high", "c/high", "b/zero", "a/low"]);
}

#[test]
fn a_raised_item_moves_to_its_new_priority_in_its_group() {
    let mut s = grouped();
    add(&mut s, "a/0", None, 0);
    add(&mut s, "a/1", None, 0);
    add(&mut s, "b/0", None, 0);
    add(&mut s, "a/1", Some(3), 0);
    s.check();
    assert_eq!(drain(&mut s, 0), ["a/1", "a/0", "b/0"]);
}

#[test]
fn a_group_at_its_limit_holds_back_no_other_and_rejoins_when_a_lease_is_done() {
    let mut s = queue(FlowConfig {
        max_in_flight_per_group: Some(1),
        ..FlowConfig::default()
    });
    add(&mut s, "noisy/0", None, 0);
    add(&mut s, "noisy/1", None, 0);
    add(&mut s, "a/0", None, 0);
    add(&mut s, "b/0", None, 0);
    let (first, slot) = pop(&mut s, 0).unwrap();
    assert_eq!(first, "noisy/0");
    assert_eq!(pop(&mut s, 0).unwrap().0, "a/0");
    assert_eq!(pop(&mut s, 0).unwrap().0, "b/0");
    assert!(pop(&mut s, 0).is_none(), "noisy is at its limit");
    assert_eq!(s.len(), 1, "its item is still queued");
    assert_eq!(s.flow().unwrap().stats().groups_saturated, 3);
    s.done(slot, 0);
    s.check();
    assert_eq!(pop(&mut s, 0).unwrap().0, "noisy/1");
}

#[test]
fn a_per_group_override_and_the_queue_wide_limit_hold() {
    let mut config = FlowConfig {
        max_in_flight: Some(3),
        max_in_flight_per_group: Some(1),
        ..FlowConfig::default()
    };
    config.group_limits.insert("big".into(), 2);
    let mut s = queue(config);
    for i in 0..3 {
        add(&mut s, &format!("big/{i}"), None, 0);
        add(&mut s, &format!("small/{i}"), None, 0);
        add(&mut s, &format!("other/{i}"), None, 0);
    }
    let mut out = Vec::new();
    while let Some((item, _)) = pop(&mut s, 0) {
        out.push(item);
    }
    assert_eq!(out, ["big/0", "small/0", "other/0"], "three at most in all");
    assert_eq!(s.processing(), 3);
}

#[test]
fn an_item_re_added_while_processing_waits_for_its_own_done_under_a_limit() {
    let mut s = queue(FlowConfig {
        max_in_flight_per_group: Some(2),
        ..FlowConfig::default()
    });
    add(&mut s, "a/0", None, 0);
    let (_, slot) = pop(&mut s, 0).unwrap();
    add(&mut s, "a/0", None, 0);
    assert!(
        pop(&mut s, 0).is_none(),
        "a free slot does not hand out its own item"
    );
    assert!(s.done(slot, 0).requeued);
    s.check();
    assert_eq!(pop(&mut s, 0).unwrap().0, "a/0");
}

#[test]
fn weights_give_a_group_that_many_turns_in_a_row() {
    let mut config = FlowConfig::default();
    config.group_weights.insert("heavy".into(), 3);
    let mut s = queue(config);
    for i in 0..6 {
        add(&mut s, &format!("heavy/{i}"), None, 0);
        add(&mut s, &format!("light/{i}"), None, 0);
    }
    let order: Vec<String> = drain(&mut s, 0)
        .into_iter()
        .map(|item| group_of(&item).to_owned())
        .collect();
    assert_eq!(
        order,
        [
            "heavy", "heavy", "heavy", "light", "heavy", "heavy", "heavy", "light", "light",
            "light", "light", "light"
        ]
    );
}

#[test]
fn the_queue_wide_rate_paces_hand_outs_and_reports_the_next_token() {
    let mut s = queue(FlowConfig {
        rate: Some(Rate::new(10.0, 2)),
        ..FlowConfig::default()
    });
    for i in 0..5 {
        add(&mut s, &format!("a/{i}"), None, 0);
    }
    assert_eq!(drain(&mut s, 0).len(), 2, "the burst");
    assert_eq!(s.next_deadline(), Some(100 * MS));
    assert!(s.needs_promote());
    assert_eq!(s.promote(99 * MS).ready, 0);
    assert!(pop(&mut s, 99 * MS).is_none());
    assert_eq!(s.promote(100 * MS).ready, 1, "a waiting getter may go");
    assert_eq!(drain(&mut s, 100 * MS), ["a/2"]);
    assert_eq!(
        drain(&mut s, 300 * MS),
        ["a/3", "a/4"],
        "tokens saved up to the burst"
    );
}

#[test]
fn a_group_waiting_for_its_token_leaves_the_turns_to_others() {
    let mut config = FlowConfig::default();
    config.group_rates.insert("slow".into(), Rate::new(1.0, 1));
    let mut s = queue(config);
    for i in 0..3 {
        add(&mut s, &format!("slow/{i}"), None, 0);
        add(&mut s, &format!("fast/{i}"), None, 0);
    }
    assert_eq!(drain(&mut s, 0), ["slow/0", "fast/0", "fast/1", "fast/2"]);
    assert_eq!(s.next_deadline(), Some(1_000 * MS));
    assert_eq!(s.promote(1_000 * MS).ready, 1);
    assert_eq!(drain(&mut s, 1_000 * MS), ["slow/1"]);
}

#[test]
fn delayed_items_join_their_group_when_due() {
    let mut s = grouped();
    s.flow_mut().unwrap().select("a", 0);
    s.add_at("a/late".to_owned(), 10, None);
    add(&mut s, "a/0", None, 0);
    add(&mut s, "b/0", None, 0);
    s.promote(10);
    s.check();
    assert_eq!(drain(&mut s, 10), ["a/0", "b/0", "a/late"]);
}

#[test]
fn groups_are_forgotten_once_empty() {
    let mut s = grouped();
    for round in 0..100 {
        add(&mut s, &format!("g{round}/x"), None, round);
        assert_eq!(drain(&mut s, round).len(), 1);
    }
    assert!(
        s.flow().unwrap().stats().groups <= 8,
        "{} groups kept",
        s.flow().unwrap().stats().groups
    );
}

#[test]
fn a_burst_compacts_with_groups() {
    let mut s = grouped();
    let n = 3 * compact::SHRINK_FLOOR;
    for i in 0..n {
        add(&mut s, &format!("g{}/{i}", i % 3), None, 0);
    }
    let mut out = Vec::new();
    while let Some((item, slot)) = s.pop(0).map(|p| (p.item, p.slot)) {
        out.push(item);
        s.done(slot, 0);
        if out.len() % 97 == 0 {
            s.check();
        }
    }
    assert_eq!(out.len(), n);
    for (i, item) in out.iter().enumerate().take(30) {
        assert_eq!(group_of(item), format!("g{}", i % 3));
    }
    s.check();
}

// ===== the property test =====

#[derive(Debug, Clone)]
enum Op {
    /// Add item `item` of group `group`, maybe with a priority.
    Add {
        group: u8,
        item: u8,
        priority: Option<i32>,
    },
    /// Add it after a delay.
    AddAfter { group: u8, item: u8, delay: u64 },
    /// A getter hands out.
    Get,
    /// The lease at this index (modulo the leases out) is done (or lost: in memory alike).
    Done(usize),
    /// Time passes.
    Step(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..6, prop_oneof![3 => Just(None), 1 => (0i32..2).prop_map(Some)])
            .prop_map(|(group, item, priority)| Op::Add { group, item, priority }),
        1 => (0u8..4, 0u8..6, 1u64..4).prop_map(|(group, item, delay)| Op::AddAfter { group, item, delay }),
        4 => Just(Op::Get),
        3 => any::<usize>().prop_map(Op::Done),
        1 => (1u64..3).prop_map(Op::Step),
    ]
}

/// The model: each item's state, its ready order and priority; limits per group.
#[derive(Default)]
struct Model {
    /// Queued items: (priority, ready sequence).
    queued: HashMap<String, (i32, u64)>,
    /// Items out on a lease; re-added ones are also in `dirty` with the priority asked.
    leased: HashSet<String>,
    dirty: HashMap<String, Option<i32>>,
    /// Delayed: due time, priority and the order of its first delayed add.
    delayed: HashMap<String, (u64, i32, u64)>,
    seq: u64,
    /// Per group and priority: the pop index of its last hand-out there (turns are taken
    /// among the groups of one priority).
    last_pop: HashMap<(String, i32), usize>,
    /// Per group and priority: since which pop it has been continuously able to hand out
    /// at that priority, the top one (checked before every pop).
    able_since: HashMap<(String, i32), usize>,
    pops: usize,
}

impl Model {
    fn top(&self) -> Option<i32> {
        self.queued.values().map(|&(p, _)| p).max()
    }

    fn in_flight(&self, group: &str) -> usize {
        self.leased.iter().filter(|i| group_of(i) == group).count()
    }

    /// Groups that may hand out now, at the top priority among them.
    fn able(&self, limit: usize, max: usize) -> (Option<i32>, HashSet<String>) {
        if self.leased.len() >= max {
            return (None, HashSet::new());
        }
        let free = |item: &String| self.in_flight(group_of(item)) < limit;
        let top = self
            .queued
            .iter()
            .filter(|(item, _)| free(item))
            .map(|(_, &(p, _))| p)
            .max();
        let groups = self
            .queued
            .iter()
            .filter(|(item, (p, _))| Some(*p) == top && free(item))
            .map(|(item, _)| group_of(item).to_owned())
            .collect();
        (top, groups)
    }

    fn make_ready(&mut self, item: String, priority: i32) {
        self.seq += 1;
        self.queued.insert(item, (priority, self.seq));
    }
}

fn run(ops: Vec<Op>, limit: usize, max: usize) -> Result<(), TestCaseError> {
    let mut s = queue(FlowConfig {
        max_in_flight: Some(max),
        max_in_flight_per_group: Some(limit),
        ..FlowConfig::default()
    });
    let mut m = Model::default();
    let mut leases: Vec<(String, u32)> = Vec::new();
    let mut now = 0u64;
    let _ = m.top();
    for op in ops {
        match op {
            Op::Add {
                group,
                item,
                priority,
            } => {
                let name = format!("g{group}/{item}");
                add(&mut s, &name, priority, now);
                if m.leased.contains(&name) {
                    m.delayed.remove(&name);
                    let asked = m.dirty.entry(name).or_insert(None);
                    if let Some(p) = priority {
                        *asked = Some(asked.map_or(p, |q: i32| q.max(p)));
                    }
                } else if let Some((p, seq)) = m.queued.get(&name).copied() {
                    if let Some(q) = priority.filter(|&q| q > p) {
                        m.seq += 1;
                        let _ = seq;
                        m.queued.insert(name, (q, m.seq));
                    }
                } else if let Some((_, p, _)) = m.delayed.remove(&name) {
                    m.make_ready(name, priority.map_or(p, |q| q.max(p)));
                } else {
                    m.make_ready(name, priority.unwrap_or(0));
                }
            }
            Op::AddAfter { group, item, delay } => {
                let name = format!("g{group}/{item}");
                s.flow_mut().unwrap().select(group_of(&name), now);
                s.add_at(name.clone(), now + delay, None);
                let queued = m.queued.contains_key(&name) || m.dirty.contains_key(&name);
                if !queued {
                    let at = now + delay;
                    m.seq += 1;
                    let e = m.delayed.entry(name).or_insert((at, 0, m.seq));
                    e.0 = e.0.min(at);
                }
            }
            Op::Get => {
                let (top, able) = m.able(limit, max);
                if let Some(top) = top {
                    for group in &able {
                        m.able_since.entry((group.clone(), top)).or_insert(m.pops);
                    }
                }
                m.able_since
                    .retain(|(group, p), _| Some(*p) == top && able.contains(group));
                match pop(&mut s, now) {
                    None => prop_assert!(
                        able.is_empty(),
                        "nothing handed out while {able:?} could hand out"
                    ),
                    Some((item, slot)) => {
                        let group = group_of(&item).to_owned();
                        let (priority, seq) =
                            m.queued.remove(&item).expect("handed out a queued item");
                        prop_assert_eq!(Some(priority), top, "strict priorities");
                        prop_assert!(able.contains(&group), "{} may not hand out", group);
                        // FIFO within the group at this priority.
                        for (other, &(p, q)) in &m.queued {
                            if group_of(other) == group && p == priority {
                                prop_assert!(q > seq, "{} came out before {}", item, other);
                            }
                        }
                        // Fairness: every other group able since this group's last turn had one.
                        let key = (group.clone(), priority);
                        if let Some(&last) = m.last_pop.get(&key) {
                            for (other, &since) in &m.able_since {
                                if *other != key && since < last {
                                    let had = m.last_pop.get(other).is_some_and(|&l| l > last);
                                    prop_assert!(
                                        had,
                                        "{:?} waited through two turns of {:?}",
                                        other,
                                        key
                                    );
                                }
                            }
                        }
                        m.pops += 1;
                        m.last_pop.insert(key.clone(), m.pops);
                        m.able_since.remove(&key);
                        m.leased.insert(item.clone());
                        leases.push((item, slot));
                    }
                }
                // Limits, whatever happened.
                let mut by_group: BTreeMap<&str, usize> = BTreeMap::new();
                for (item, _) in &leases {
                    *by_group.entry(group_of(item)).or_default() += 1;
                }
                prop_assert!(leases.len() <= max);
                prop_assert!(by_group.values().all(|&n| n <= limit), "{:?}", by_group);
            }
            Op::Done(i) => {
                if leases.is_empty() {
                    continue;
                }
                let (item, slot) = leases.remove(i % leases.len());
                s.done(slot, now);
                s.check();
                m.leased.remove(&item);
                if let Some(asked) = m.dirty.remove(&item) {
                    m.make_ready(item, asked.unwrap_or(0));
                } else if m.delayed.contains_key(&item) {
                    // Stays delayed.
                }
            }
            Op::Step(d) => {
                now += d;
                s.promote(now);
                s.check();
                let mut due: Vec<(u64, u64, String, i32)> = m
                    .delayed
                    .iter()
                    .filter(|(_, (at, _, _))| *at <= now)
                    .map(|(item, &(at, p, seq))| (at, seq, item.clone(), p))
                    .collect();
                due.sort();
                for (_, _, item, p) in due {
                    m.delayed.remove(&item);
                    if m.leased.contains(&item) {
                        m.dirty.entry(item).or_insert(None);
                    } else {
                        m.make_ready(item, p);
                    }
                }
            }
        }
        prop_assert_eq!(s.len(), m.queued.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn flow_control_matches_the_model(
        ops in prop::collection::vec(op(), 1..120),
        limit in 1usize..3,
        max in 2usize..6,
    ) {
        run(ops, limit, max)?;
    }
}
