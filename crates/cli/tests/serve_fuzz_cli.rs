//! Mutated OpenAI request bodies against a running `frugal serve` (SmolLM2-135M, a short
//! context): bytes mutated (mostly not JSON), and JSON whose fields take odd values (negative,
//! huge, wrong types, null, nested, missing, unknown). Every answer is a 200 or a 4xx with an
//! error body, never a 5xx or a dropped connection, and a plain request is answered afterwards.

mod common;

use common::served::Served;
use common::smollm2;
use serde_json::{json, Value};
use std::collections::BTreeMap;

const PATHS: [&str; 2] = ["/v1/completions", "/v1/chat/completions"];

fn bases() -> [Value; 2] {
    [
        json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0, "stop": ["."], "seed": 3}),
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": true,
               "top_k": 5}),
    ]
}

/// A value of another shape or an extreme one.
fn odd(rng: &mut data::SplitMix64) -> Value {
    let all = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-1e308),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(0.5),
        json!("x"),
        json!(""),
        json!("\u{0}\u{ffff}"),
        json!([]),
        json!([1, "a", null]),
        json!({}),
        json!({"role": "system"}),
        json!(true),
        json!([{"role": "user"}]),
        json!([{"role": "tool", "content": 3}]),
    ];
    all[(rng.next_u64() % all.len() as u64) as usize].clone()
}

#[test]
fn mutated_request_bodies_get_answers_or_clear_errors() {
    let model = smollm2();
    let server = Served::start_with(&model, &["--ctx", "48", "--queue", "64"]);
    let mut m = rng::mutate::Mutator::new(0x6f70_656e);
    let mut rng = data::SplitMix64::new(0x6a73_6f6e);
    let mut statuses = BTreeMap::new();
    let mut check = |path: &str, body: &str| {
        let (status, answer) = server.post(path, body);
        *statuses.entry(status).or_insert(0) += 1;
        assert!(
            status == 200 || (400..500).contains(&status),
            "{status} for {body}: {answer}"
        );
        if status != 200 {
            assert!(
                answer.contains("error"),
                "{status} without an error body: {answer}"
            );
        }
    };
    for i in 0..400 {
        let (path, mut base) = (PATHS[i % 2], bases()[i % 2].clone());
        // Bytes mutated.
        let bytes = m.mutate(base.to_string().as_bytes());
        check(path, &String::from_utf8_lossy(&bytes));
        // Fields given odd values, dropped, or added.
        let obj = base.as_object_mut().unwrap();
        let keys: Vec<String> = obj.keys().cloned().collect();
        for k in &keys {
            match rng.next_u64() % 4 {
                0 => {
                    obj.insert(k.clone(), odd(&mut rng));
                }
                1 if rng.next_u64() % 3 == 0 => {
                    obj.remove(k);
                }
                _ => {}
            }
        }
        if rng.next_u64() % 5 == 0 {
            obj.insert("n".into(), odd(&mut rng));
        }
        check(path, &base.to_string());
    }
    eprintln!("answers by status: {statuses:?}");
    assert!(statuses.get(&200).is_some_and(|n| *n > 20), "{statuses:?}");
    assert!(statuses.get(&400).is_some_and(|n| *n > 100), "{statuses:?}");
    let (status, _) = server.post(PATHS[0], &bases()[0].to_string());
    assert_eq!(status, 200);
}
