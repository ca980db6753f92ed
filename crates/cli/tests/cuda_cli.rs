//! `frugal train --device cuda` on a machine without a GPU, or in a build without the CUDA
//! backend: exit 2 with an error that says which and what to do, never a panic; and what the
//! CUDA backend does not run is refused by name before any GPU work. (`.ci/run` runs this file
//! on the default build and on a `--features cuda` one.)

mod common;
use common::frugal;

fn stderr_of(args: &[&str]) -> String {
    let out = frugal(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn without_a_gpu_device_cuda_exits_2_saying_why() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine: dev/gpu_check.sh trains there
    }
    let stderr = stderr_of(&["train", "--device", "cuda", "--steps", "1"]);
    if cfg!(feature = "cuda") {
        // A CUDA build on a machine with no GPU: the missing library is named.
        assert!(
            stderr.contains("libcuda.so (the NVIDIA driver) not found")
                || stderr.contains("libnvrtc")
                || stderr.contains("libcublas"),
            "{stderr}"
        );
    } else {
        assert!(stderr.contains("--features cuda"), "{stderr}");
    }
}

#[test]
fn what_the_cuda_backend_does_not_run_is_refused_by_name() {
    // The backend's own answer (`Backend::supports`), before any GPU work: in a CUDA build the
    // typed set-up error names the feature; a build without the backend says how to get it.
    for (flags, feature) in [
        (&["--ranks", "2"][..], "several ranks"),
        (&["--tp", "2", "--ranks", "2"][..], "tensor parallelism"),
        (&["--lora-rank", "8"][..], "LoRA"),
        (&["--attention", "eager"][..], "the eager attention kernel"),
        (
            &["--model", "mixtral-tiny"][..],
            "mixture-of-experts layers",
        ),
        (&["--model", "deepseek-tiny"][..], "latent-attention layers"),
    ] {
        let mut args = vec!["train", "--device", "cuda", "--steps", "1"];
        args.extend(flags);
        let stderr = stderr_of(&args);
        let says = if cfg!(feature = "cuda") {
            format!("the cuda backend does not run {feature}")
        } else {
            "--features cuda".to_string()
        };
        assert!(stderr.contains(&says), "{flags:?}: {stderr}");
    }
    let stderr = stderr_of(&[
        "train",
        "--device",
        "cuda",
        "--out",
        "/tmp/frugal-cuda-never",
    ]);
    assert!(stderr.contains("keeps no weights"), "{stderr}");
    assert!(!std::path::Path::new("/tmp/frugal-cuda-never").exists());
    // One process on one device, whatever the build: MPI ranks are refused first.
    let stderr = stderr_of(&["train", "--device", "cuda", "--comm", "mpi"]);
    assert!(stderr.contains("one process on one device"), "{stderr}");
}

#[test]
fn an_unknown_device_is_a_usage_error() {
    let out = frugal(&["train", "--device", "tpu"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for device in plan_frugal::device::Device::ALL {
        assert!(stderr.contains(device.name()), "{stderr}");
    }
}

#[test]
fn the_cuda_plan_adds_the_backend_scratch_pages_and_a_context_to_the_cpu_plan() {
    let plan = |device: &str| {
        common::json(&frugal(&[
            "plan",
            "--model",
            "gpt2-mini",
            "--train",
            "--runtime",
            "frugal",
            "--batch",
            "4",
            "--seq",
            "64",
            "--device",
            device,
            "--json",
        ]))["per_device"]
            .clone()
    };
    let (cpu, gpu) = (plan("cpu"), plan("cuda"));
    let bytes = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    assert_eq!(bytes(&gpu, "peak_bytes"), bytes(&cpu, "peak_bytes"));
    let page = 2u64 << 20;
    let slab_pages = bytes(&cpu, "reserved_bytes").div_ceil(page) * page;
    // The 32 MiB cuBLAS workspace and 8 KiB of reduction partials: 17 pages.
    assert_eq!(bytes(&gpu, "reserved_bytes"), slab_pages + 17 * page);
    assert_eq!(bytes(&cpu, "context_bytes"), 0);
    assert!(bytes(&gpu, "context_bytes") > 0);
    assert_eq!(
        bytes(&gpu, "total_bytes"),
        bytes(&gpu, "reserved_bytes") + bytes(&gpu, "context_bytes")
    );
    let other = frugal(&[
        "plan",
        "--model",
        "gpt2-mini",
        "--train",
        "--device",
        "cuda",
    ]);
    common::fails_with(&other, "add --runtime frugal");
    let infer = frugal(&[
        "plan",
        "--model",
        "gpt2-mini",
        "--infer",
        "--runtime",
        "frugal",
        "--device",
        "cuda",
    ]);
    common::fails_with(&infer, "inference runs on the CPU backend only");
}
