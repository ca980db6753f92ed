//! Mutated quantized weights files (`weights.frugal`): the whole file's bytes, the header's JSON
//! (re-signed with its new length and checksum, so the parser behind the checksum sees the
//! damage) and a tensor's bytes (re-signed the same way) are each mutated. Each file is read as
//! `frugal generate --model DIR` reads it: the header, the model's config and format, a worker
//! planned from them, the weights, a prefill and a decode step. Each loads and runs or fails
//! with an error; none panics.

use cpu::Cpu;
use engine::testkit::{llama_tiny, tokens};
use engine::ModelConfig;
use infer::{file, Worker};
use plan_frugal::{KvFormat, ServeSetup, WeightFormat};
use std::path::Path;

/// The file's parts: the header's JSON and the payload after it.
fn split(bytes: &[u8]) -> (serde_json::Value, Vec<u8>) {
    let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[20..20 + len]).unwrap();
    (header, bytes[20 + len..].to_vec())
}

/// A file of `json` (its length and checksum written for it) and `payload`.
fn sign(json: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = file::MAGIC.to_vec();
    out.extend((json.len() as u64).to_le_bytes());
    out.extend(crc32fast::hash(json).to_le_bytes());
    out.extend(json);
    out.extend(payload);
    out
}

/// Reads `path` as the CLI does and runs a step; a worker is planned within 256 MiB.
fn run(path: &Path) -> Result<(), String> {
    let e = |e: engine::EngineError| e.to_string();
    let (header, _) = file::read_header(path).map_err(e)?;
    let config = header.model_config(path).map_err(e)?;
    let format = header.format().map_err(e)?;
    if format == WeightFormat::F32 {
        let units = plan_frugal::param_units(&config.shape, 1).map_err(|x| x.to_string())?;
        file::read_f32_units(path, &units).map_err(e)?;
        return Ok(());
    }
    let setup = ServeSetup::generation(&config.shape, 1, 16, format, KvFormat::F32, 4, 1);
    let mut w = Worker::on(Cpu::new(), config, setup, Some(256 << 20)).map_err(e)?;
    file::load(&mut w, path).map_err(e)?;
    let s = w.new_sequence();
    let mut logits = Vec::new();
    let vocab = w.config.shape.vocab.min(64);
    w.prefill(s, &tokens(3, vocab, 1), &mut logits).map_err(e)?;
    w.decode(&[s], &[1], &mut logits).map_err(e)?;
    Ok(())
}

#[test]
fn mutated_quantized_files_load_and_run_or_fail_clearly() {
    let dir = std::env::temp_dir().join(format!("frugal-qfuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file::FILE_NAME);
    let model = ModelConfig::from_shape(llama_tiny()).unwrap();
    let mut mutator = rng::mutate::Mutator::new(0x7166_757a);
    let (mut ran, mut refused) = (0, 0);
    for (f, format) in [
        WeightFormat::Int4 {
            group: 32,
            asym: true,
        },
        WeightFormat::Int8,
        WeightFormat::F32,
    ]
    .into_iter()
    .enumerate()
    {
        let setup = ServeSetup::generation(&model.shape, 1, 16, format, KvFormat::F32, 4, 1);
        let mut w = Worker::new(model.clone(), setup).unwrap();
        w.fill_random(1);
        file::save(&w, &path).unwrap();
        let good = std::fs::read(&path).unwrap();
        assert_eq!(run(&path), Ok(()));
        let (header, payload) = split(&good);
        let json = serde_json::to_vec(&header).unwrap();
        for i in 0..600 {
            let bad = match (f * 600 + i) % 3 {
                0 => mutator.mutate(&good),
                1 => sign(&mutator.mutate(&json), &payload),
                _ => {
                    // One tensor's bytes, with its size and checksum re-listed.
                    let mut h = header.clone();
                    let tensors = h["tensors"].as_array_mut().unwrap();
                    let t = i % tensors.len();
                    let at: u64 = tensors[..t]
                        .iter()
                        .map(|x| x["bytes"].as_u64().unwrap())
                        .sum();
                    let n = tensors[t]["bytes"].as_u64().unwrap();
                    let (at, n) = (at as usize, n as usize);
                    let bytes = mutator.mutate(&payload[at..at + n]);
                    tensors[t]["bytes"] = bytes.len().into();
                    tensors[t]["crc32"] = crc32fast::hash(&bytes).into();
                    let mut p = payload[..at].to_vec();
                    p.extend(&bytes);
                    p.extend(&payload[at + n..]);
                    sign(&serde_json::to_vec(&h).unwrap(), &p)
                }
            };
            std::fs::write(&path, &bad).unwrap();
            match run(&path) {
                Ok(()) => ran += 1,
                Err(text) => {
                    refused += 1;
                    assert!(!text.trim().is_empty());
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{ran} mutated files ran, {refused} refused");
    assert!(ran > 50 && refused > 300, "{ran} ran, {refused} refused");
}
