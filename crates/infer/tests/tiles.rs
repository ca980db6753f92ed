//! int4, int8 and nf4 weights the CPU backend keeps in tiles of eight rows (made at `avx2`,
//! `avx2vnni`, and at `avx512` and `avx512vnni`, which multiply two tiles a 512-bit vector): the
//! arena holds them in another order, a saved weights file holds the same bytes as one saved from
//! rows, a file loads back into tiles, and the model answers as it does from rows: dense, and
//! Mixtral's experts, each a range of the stacked matrices' tiles (or, where an expert's rows are
//! not whole tiles, rows).

use cpu::Cpu;
use engine::backend::Backend;
use engine::testkit::{llama_tiny, mixtral_tiny, tokens, Capped};
use engine::ModelConfig;
use infer::{file, Worker};
use kernels::cpu::{supported, Level};
use plan::buffer::Category;
use plan_frugal::{KvFormat, ServeSetup, WeightFormat};

/// A worker of `shape` made at `level`, its weights random fp32 values quantized (so every
/// group has a scale, and a zero point, of its own).
fn worker(level: Level, shape: &plan::ModelShape, format: WeightFormat) -> Worker {
    let _cap = Capped::at(level);
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup::generation(&config.shape, 2, 16, format, KvFormat::F32, 4, 1);
    let mut w = Worker::on(Cpu::new(), config, setup, None).unwrap();
    let mut state = 1u64;
    let values: Vec<Vec<f32>> = plan_frugal::param_units(&shape.clone(), 1)
        .unwrap()
        .iter()
        .map(|u| {
            let n = u
                .views
                .iter()
                .map(|v| (v.offset + v.numel()) as usize)
                .max();
            (0..n.unwrap_or(0))
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Magnitudes that differ by group: scales and zero points vary.
                    let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    u * (1.0 + (state >> 60) as f32)
                })
                .collect()
        })
        .collect();
    w.load_units(&values).unwrap();
    w
}

/// The logits of a prompt of 5 and a decode step of 2 sequences, at `level`.
fn logits(w: &mut Worker, level: Level) -> Vec<f32> {
    let _cap = Capped::at(level);
    let vocab = w.config.shape.vocab;
    let (a, b) = (w.new_sequence(), w.new_sequence());
    let (mut out, mut all) = (Vec::new(), Vec::new());
    w.prefill(a, &tokens(5, vocab, 2), &mut out).unwrap();
    all.extend(&out);
    w.prefill(b, &tokens(3, vocab, 3), &mut out).unwrap();
    all.extend(&out);
    w.decode(&[a, b], &[1, 2], &mut out).unwrap();
    all.extend(&out);
    w.free(a);
    w.free(b);
    all
}

/// Every weight buffer's bytes as the arena holds them.
fn arena_bytes(w: &Worker) -> Vec<u8> {
    let mut out = Vec::new();
    for b in w
        .plan
        .buffers
        .iter()
        .filter(|b| b.category == Category::Params)
    {
        let t = w
            .arena
            .key_tensor(b.key.unwrap(), engine::backend::DType::U8);
        let at = out.len();
        out.resize(at + t.len, 0);
        w.arena
            .backend()
            .download_bytes(&w.arena, t, &mut out[at..]);
    }
    out
}

#[test]
fn tiled_int4_int8_and_nf4_save_load_and_answer_as_rows_do() {
    let dir = std::env::temp_dir().join(format!("frugal-tiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut mixtral = mixtral_tiny();
    // Experts of 32: int4's groups divide every matrix's rows.
    mixtral.moe.as_mut().unwrap().d_ff_expert = 32;
    let levels = [
        Level::Avx2,
        Level::Avx2Vnni,
        Level::Avx512,
        Level::Avx512Vnni,
    ];
    // Experts of 6: 12 rows of gate|up each, not whole tiles, though the stack's 48 are.
    let mut odd = mixtral_tiny();
    odd.moe.as_mut().unwrap().d_ff_expert = 6;
    let int4 = |asym| WeightFormat::Int4 { group: 32, asym };
    let shapes = [
        (llama_tiny(), int4(false)),
        (mixtral.clone(), int4(true)),
        (llama_tiny(), WeightFormat::Int8),
        (mixtral.clone(), WeightFormat::Int8),
        (odd, WeightFormat::Int8),
        (llama_tiny(), WeightFormat::Nf4 { group: 32 }),
        (mixtral, WeightFormat::Nf4 { group: 32 }),
    ];
    // No AVX2: the backend keeps rows at every level, and there is nothing to test.
    for level in levels.into_iter().filter(|l| supported().contains(l)) {
        for (shape, format) in &shapes {
            tiles_as_rows(&dir, level, shape, *format);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `shape` worker made at `level` keeps tiles, saves and loads rows' files, and answers as one
/// that keeps rows.
fn tiles_as_rows(
    dir: &std::path::Path,
    level: Level,
    shape: &plan::ModelShape,
    format: WeightFormat,
) {
    let name = &format!("{} {format:?} at {level}", shape.name);
    let mut tiled = worker(level, shape, format);
    let mut rows = worker(Level::Portable, shape, format);
    assert!(
        arena_bytes(&tiled) != arena_bytes(&rows),
        "{name}: nothing was tiled"
    );
    let (tiled_path, rows_path) = (dir.join("tiled.frugal"), dir.join("rows.frugal"));
    file::save(&tiled, &tiled_path).unwrap();
    file::save(&rows, &rows_path).unwrap();
    let saved = std::fs::read(&tiled_path).unwrap();
    assert!(
        saved == std::fs::read(&rows_path).unwrap(),
        "{name}: the files differ"
    );
    // Saving left the tiles as they were; a rows file loads into tiles.
    let want = logits(&mut tiled, level);
    let mut loaded = worker(level, shape, format);
    file::load(&mut loaded, &rows_path).unwrap();
    assert!(
        arena_bytes(&loaded) == arena_bytes(&tiled),
        "{name}: loaded tiles"
    );
    let got = logits(&mut loaded, level);
    assert!(got == want, "{name}: a loaded file answers otherwise");
    // Tiles against rows at the same level (a backend made at `portable` keeps rows, run here
    // at `level` on its integer kernels): the same 8-bit activations, sums in another order.
    let exact = logits(&mut rows, level);
    let (err, norm) = want.iter().zip(&exact).fold((0.0, 0.0), |(e, n), (g, x)| {
        (e + f64::from(g - x).powi(2), n + f64::from(*x).powi(2))
    });
    assert!(
        err.sqrt() <= 1e-4 * norm.sqrt(),
        "{name}: {err} against {norm}"
    );
}
