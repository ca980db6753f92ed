//! The train/validation split, the shuffling training loader (determinism, rank sharding, resume)
//! and the validation batches, on token streams whose ids are their positions so every row can be
//! traced back to where it was cut.

use std::collections::HashSet;

use data::{BatchShape, DataError, Dataset, LoaderConfig, LoaderPosition, WindowOrder};

/// A dataset whose token i is i: every window is identifiable by its first token.
fn positional(n_tokens: u32, val_fraction: f64) -> Dataset {
    Dataset::new((0..n_tokens).collect(), n_tokens, val_fraction).unwrap()
}

fn buffers(shape: BatchShape) -> (Vec<u32>, Vec<u32>) {
    (
        vec![0; shape.tokens_per_batch()],
        vec![0; shape.tokens_per_batch()],
    )
}

/// The next `n` batches' inputs, one Vec per batch.
fn take(loader: &mut data::Loader, n: usize) -> Vec<Vec<u32>> {
    let (mut x, mut y) = buffers(loader.config().shape);
    (0..n)
        .map(|_| {
            loader.next_batch(&mut x, &mut y);
            x.clone()
        })
        .collect()
}

#[test]
fn rows_are_windows_of_the_train_split_with_shifted_targets() {
    let ds = positional(10_000, 0.1);
    let shape = BatchShape::single(3, 32);
    let mut loader = ds.train_loader(LoaderConfig::shuffled(shape, 7)).unwrap();
    let (mut x, mut y) = buffers(shape);
    for _ in 0..50 {
        loader.next_batch(&mut x, &mut y);
        for row in 0..3 {
            let (xs, ys) = (&x[row * 32..(row + 1) * 32], &y[row * 32..(row + 1) * 32]);
            assert_eq!(xs[0] % 32, 0, "windows start every seq_len tokens");
            for t in 0..32 {
                assert_eq!(xs[t], xs[0] + t as u32);
                assert_eq!(ys[t], xs[t] + 1);
            }
            assert!(ys[31] < 9_000, "a training target reached into validation");
        }
    }
}

#[test]
fn same_seed_same_batches_other_seed_other_batches() {
    let ds = positional(20_000, 0.1);
    let config = LoaderConfig::shuffled(BatchShape::single(4, 16), 42);
    let a = take(&mut ds.train_loader(config).unwrap(), 40);
    let b = take(&mut ds.train_loader(config).unwrap(), 40);
    assert_eq!(a, b);
    let other = LoaderConfig::shuffled(BatchShape::single(4, 16), 43);
    assert_ne!(a, take(&mut ds.train_loader(other).unwrap(), 40));
}

#[test]
fn each_epoch_visits_every_window_once_in_a_new_order() {
    // 4097 tokens of train split: (4097 - 1) / 16 = 256 windows = 32 batches of 8 rows exactly.
    let ds = Dataset::new((0..4097).collect(), 4097, 0.0).unwrap();
    let shape = BatchShape::single(8, 16);
    let mut loader = ds.train_loader(LoaderConfig::shuffled(shape, 1)).unwrap();
    assert_eq!((loader.n_windows(), loader.batches_per_epoch()), (256, 32));
    let firsts = |batches: Vec<Vec<u32>>| -> Vec<u32> {
        batches
            .iter()
            .flat_map(|x| x.chunks(16).map(|row| row[0]))
            .collect()
    };
    let epoch0 = firsts(take(&mut loader, 32));
    assert_eq!(
        loader.position(),
        LoaderPosition {
            epoch: 1,
            batch_in_epoch: 0
        }
    );
    let epoch1 = firsts(take(&mut loader, 32));
    let all: HashSet<u32> = (0..256).map(|w| w * 16).collect();
    assert_eq!(epoch0.iter().copied().collect::<HashSet<_>>(), all);
    assert_eq!(epoch1.iter().copied().collect::<HashSet<_>>(), all);
    assert_ne!(epoch0, epoch1);

    let mut sequential = ds
        .train_loader(LoaderConfig {
            shape,
            order: WindowOrder::Sequential,
        })
        .unwrap();
    assert_eq!(
        firsts(take(&mut sequential, 32)),
        (0..256).map(|w| w * 16).collect::<Vec<_>>()
    );
}

#[test]
fn n_ranks_of_b_rows_equal_one_rank_of_n_times_b_rows() {
    let ds = positional(30_000, 0.1);
    let (b, t, world) = (3, 24, 4);
    let mut global = ds
        .train_loader(LoaderConfig::shuffled(BatchShape::single(world * b, t), 9))
        .unwrap();
    let mut ranks: Vec<_> = (0..world)
        .map(|rank| {
            let shape = BatchShape {
                batch_size: b,
                seq_len: t,
                rank,
                world_size: world,
            };
            ds.train_loader(LoaderConfig::shuffled(shape, 9)).unwrap()
        })
        .collect();
    assert_eq!(global.batches_per_epoch(), ranks[0].batches_per_epoch());
    // Run past the end of the first epoch so the new epoch's order is checked too.
    let steps = global.batches_per_epoch() as usize + 5;
    let (mut gx, mut gy) = buffers(BatchShape::single(world * b, t));
    let (mut rx, mut ry) = buffers(BatchShape::single(b, t));
    for _ in 0..steps {
        let position = global.next_batch(&mut gx, &mut gy);
        for (rank, loader) in ranks.iter_mut().enumerate() {
            assert_eq!(loader.next_batch(&mut rx, &mut ry), position);
            let rows = rank * b * t..(rank + 1) * b * t;
            assert_eq!(rx, gx[rows.clone()]);
            assert_eq!(ry, gy[rows]);
        }
    }
    assert!(
        global.epoch() >= 1,
        "the test should cross an epoch boundary"
    );
}

#[test]
fn seek_resumes_the_same_batches_across_epochs() {
    let ds = positional(5_000, 0.1);
    let config = LoaderConfig::shuffled(BatchShape::single(4, 20), 5);
    let mut first = ds.train_loader(config).unwrap();
    let per_epoch = first.batches_per_epoch() as usize;
    take(&mut first, per_epoch - 3);
    let saved = first.position();
    let expected = take(&mut first, 10); // runs into the next epoch

    let mut resumed = ds.train_loader(config).unwrap();
    resumed.seek(saved).unwrap();
    assert_eq!(take(&mut resumed, 10), expected);
    assert_eq!(resumed.position(), first.position());

    let past_end = LoaderPosition {
        epoch: 0,
        batch_in_epoch: per_epoch as u64,
    };
    let err = resumed.seek(past_end).unwrap_err();
    assert!(matches!(err, DataError::SeekOutOfRange { .. }), "{err}");
}

#[test]
fn validation_is_the_held_out_tail_never_trained_on() {
    let ds = positional(10_000, 0.1);
    assert_eq!(ds.train_range(), 0..9_000);
    assert_eq!(ds.val_range(), 9_000..10_000);
    let shape = BatchShape::single(2, 50);
    let mut train = ds.train_loader(LoaderConfig::shuffled(shape, 3)).unwrap();
    let (mut x, mut y) = buffers(shape);
    let mut trained = HashSet::new();
    for _ in 0..3 * train.batches_per_epoch() {
        train.next_batch(&mut x, &mut y);
        trained.extend(x.iter().chain(y.iter()).copied());
    }
    let mut val = ds.val_batches(shape).unwrap();
    let mut validated = HashSet::new();
    let mut first_pass = Vec::new();
    while val.next_batch(&mut x, &mut y) {
        validated.extend(x.iter().chain(y.iter()).copied());
        first_pass.push(x.clone());
    }
    assert_eq!(first_pass.len(), val.n_batches());
    assert!(trained.is_disjoint(&validated));
    assert!(validated.iter().all(|&t| t >= 9_000));
    // Fixed windows, in order, the same every pass.
    assert_eq!(first_pass[0][0], 9_000);
    val.reset();
    assert!(val.next_batch(&mut x, &mut y));
    assert_eq!(x, first_pass[0]);
}

#[test]
fn validation_batches_shard_like_training() {
    let ds = positional(10_000, 0.3);
    let mut global = ds.val_batches(BatchShape::single(6, 10)).unwrap();
    let (mut gx, mut gy) = buffers(BatchShape::single(6, 10));
    let (mut rx, mut ry) = buffers(BatchShape::single(2, 10));
    for batch in 0..global.n_batches() {
        assert!(global.next_batch(&mut gx, &mut gy));
        for rank in 0..3 {
            let shape = BatchShape {
                batch_size: 2,
                seq_len: 10,
                rank,
                world_size: 3,
            };
            ds.val_batches(shape)
                .unwrap()
                .fill_batch(batch, &mut rx, &mut ry);
            assert_eq!(rx, gx[rank * 20..(rank + 1) * 20]);
            assert_eq!(ry, gy[rank * 20..(rank + 1) * 20]);
        }
    }
}

#[test]
fn bad_shapes_and_short_data_are_typed_errors() {
    let ds = positional(1_000, 0.1);
    let err = ds
        .train_loader(LoaderConfig::shuffled(BatchShape::single(0, 8), 0))
        .unwrap_err();
    assert!(matches!(err, DataError::ZeroShape { .. }), "{err}");
    let err = ds
        .train_loader(LoaderConfig::shuffled(BatchShape::single(2, 0), 0))
        .unwrap_err();
    assert!(matches!(err, DataError::ZeroShape { .. }), "{err}");
    let shape = BatchShape {
        batch_size: 1,
        seq_len: 8,
        rank: 2,
        world_size: 2,
    };
    let err = ds
        .train_loader(LoaderConfig::shuffled(shape, 0))
        .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::BadRank {
                rank: 2,
                world_size: 2
            }
        ),
        "{err}"
    );

    // 900 train tokens; 4 rows of 256 + 1 need 4 * 256 + 1 = 1025.
    let err = ds
        .train_loader(LoaderConfig::shuffled(BatchShape::single(4, 256), 0))
        .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TooShort {
                split: "train",
                needed_tokens: 1025,
                have_tokens: 900,
                ..
            }
        ),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("1025") && message.contains("900"),
        "{message}"
    );

    // 100 validation tokens cannot hold one window of 128 + 1.
    let err = ds.val_batches(BatchShape::single(1, 128)).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TooShort {
                split: "validation",
                ..
            }
        ),
        "{err}"
    );
    let no_val = positional(1_000, 0.0);
    let err = no_val.val_batches(BatchShape::single(1, 8)).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::EmptyDataset {
                split: "validation"
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_token_streams_are_typed_errors() {
    let err = Dataset::new(vec![], 50_257, 0.1).unwrap_err();
    assert!(matches!(err, DataError::EmptyDataset { .. }), "{err}");
    let err = Dataset::new(vec![1, 2, 50_257, 3], 50_257, 0.1).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TokenOutOfRange {
                index: 2,
                token: 50_257,
                vocab_size: 50_257,
                path: None
            }
        ),
        "{err}"
    );
    for bad in [1.0, -0.1, f64::NAN] {
        let err = Dataset::new(vec![1, 2, 3], 10, bad).unwrap_err();
        assert!(matches!(err, DataError::BadValFraction { .. }), "{err}");
    }
    // One token and a 10% split leaves nothing to train on.
    let err = Dataset::new(vec![1], 10, 0.1).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::NothingToTrain {
                total: 1,
                held_out: 1
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("1 token(s)"), "{err}");
}
