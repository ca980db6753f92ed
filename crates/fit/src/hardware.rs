//! The machines `fit` predicts step times for: GPU speed, memory and the links between devices.
//!
//! Numbers are the vendors' published datasheet figures (dense, no sparsity; links per direction),
//! not measurements, except the H200's capacity, which is what `nvidia-smi` reported on the
//! calibration machine (`shared/calibration`). Effective speed is the peak times an MFU the caller
//! states ([`DEFAULT_MFU`]). Not here: how a step uses these (the cost model, [`super::cost`]).
//! Example: `Hardware::of(gpu_by_name("h100")?)` is an 8-GPU H100 SXM node at 40% MFU.

use plan::setup::Precision;
use plan::PlanError;
use serde::Serialize;

/// A GPU model's datasheet facts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub name: &'static str,
    /// Device memory (nominal capacity; the H200's is the measured `nvidia-smi` total).
    pub memory_bytes: u64,
    /// Dense bf16/fp16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// Dense fp32 peak without TF32 (PyTorch's default for fp32 matmuls), FLOP/s.
    pub fp32_flops: f64,
    /// Device-memory bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// GPU-to-GPU bandwidth inside a node per direction (NVLink, or PCIe without it), bytes/s.
    pub intra_node_bytes_per_s: f64,
    /// Network bandwidth per GPU between nodes per direction (InfiniBand/Ethernet), bytes/s.
    pub inter_node_bytes_per_s: f64,
    /// Host-to-device bandwidth per direction (PCIe), bytes/s.
    pub host_link_bytes_per_s: f64,
}

const GIB: u64 = 1 << 30;

/// The GPUs `--gpu` accepts.
pub const GPUS: [Gpu; 6] = [
    Gpu {
        name: "h100",
        memory_bytes: 80 * GIB,
        bf16_flops: 989e12,
        fp32_flops: 67e12,
        hbm_bytes_per_s: 3.35e12,
        intra_node_bytes_per_s: 450e9,
        inter_node_bytes_per_s: 50e9,
        host_link_bytes_per_s: 64e9,
    },
    Gpu {
        name: "h200",
        memory_bytes: 143_155 * (1 << 20) + (15 << 16),
        bf16_flops: 989e12,
        fp32_flops: 67e12,
        hbm_bytes_per_s: 4.8e12,
        intra_node_bytes_per_s: 450e9,
        inter_node_bytes_per_s: 50e9,
        host_link_bytes_per_s: 64e9,
    },
    Gpu {
        name: "a100-80g",
        memory_bytes: 80 * GIB,
        bf16_flops: 312e12,
        fp32_flops: 19.5e12,
        hbm_bytes_per_s: 2.039e12,
        intra_node_bytes_per_s: 300e9,
        inter_node_bytes_per_s: 25e9,
        host_link_bytes_per_s: 32e9,
    },
    Gpu {
        name: "a100-40g",
        memory_bytes: 40 * GIB,
        bf16_flops: 312e12,
        fp32_flops: 19.5e12,
        hbm_bytes_per_s: 1.555e12,
        intra_node_bytes_per_s: 300e9,
        inter_node_bytes_per_s: 25e9,
        host_link_bytes_per_s: 32e9,
    },
    Gpu {
        name: "l40s",
        memory_bytes: 48 * GIB,
        bf16_flops: 362e12,
        fp32_flops: 91.6e12,
        hbm_bytes_per_s: 0.864e12,
        intra_node_bytes_per_s: 32e9,
        inter_node_bytes_per_s: 12.5e9,
        host_link_bytes_per_s: 32e9,
    },
    Gpu {
        name: "rtx4090",
        memory_bytes: 24 * GIB,
        bf16_flops: 165.2e12,
        fp32_flops: 82.6e12,
        hbm_bytes_per_s: 1.008e12,
        intra_node_bytes_per_s: 32e9,
        inter_node_bytes_per_s: 12.5e9,
        host_link_bytes_per_s: 32e9,
    },
];

/// Fraction of the tensor-core peak the step's GEMMs reach by default: cuBLAS reaches about 60%
/// of an H100's dense bf16 peak on transformer-sized GEMMs. The step's other costs (element-wise
/// kernels, the optimizer, dispatch) are modelled apart ([`super::cost`]), so the whole step's
/// MFU comes out lower: ~14% for GPT-2 124M and ~34% for TinyLlama on the H200 calibration, as
/// measured; Meta reports 38-43% for Llama 3 at scale.
pub const DEFAULT_MFU: f64 = 0.60;

/// Optimizer elements per second the host's CPU Adam steps per node (assumed, not measured: Adam
/// streams ~28 bytes per element, so 2×10^9/s is ~56 GB/s of host memory traffic).
pub const DEFAULT_HOST_ADAM_ELEMS_PER_S: f64 = 2e9;

/// The GPU called `name` (case-insensitive; `a100` means the 80 GB part).
pub fn gpu_by_name(name: &str) -> Result<Gpu, PlanError> {
    let lower = name.to_ascii_lowercase();
    let lower = match lower.as_str() {
        "a100" => "a100-80g",
        "4090" => "rtx4090",
        other => other,
    };
    GPUS.iter()
        .find(|g| g.name == lower)
        .copied()
        .ok_or_else(|| PlanError::Invalid {
            field: "--gpu".into(),
            reason: format!(
                "unknown GPU '{name}': use one of {}, or give --tflops and --device-memory",
                GPUS.map(|g| g.name).join(", ")
            ),
        })
}

/// The machine a search predicts for: a GPU's facts with the caller's overrides.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hardware {
    pub gpu: Gpu,
    /// Fraction of the peak the GEMMs reach (0 < mfu ≤ 1).
    pub mfu: f64,
    /// fp32 matmuls run on TF32 tensor cores (`torch.backends.cuda.matmul.allow_tf32 = True`):
    /// half the bf16 peak instead of the fp32 one.
    pub tf32: bool,
    /// GPUs sharing one host and one NVLink domain (8 for HGX boards).
    pub gpus_per_node: u32,
    /// CPU Adam throughput of one node (offload), elements/s.
    pub host_adam_elems_per_s: f64,
}

impl Hardware {
    /// `gpu` with the default MFU, 8 GPUs per node and the default host Adam rate.
    pub fn of(gpu: Gpu) -> Hardware {
        Hardware {
            gpu,
            mfu: DEFAULT_MFU,
            tf32: false,
            gpus_per_node: 8,
            host_adam_elems_per_s: DEFAULT_HOST_ADAM_ELEMS_PER_S,
        }
    }

    /// Peak FLOP/s for matmuls under `precision` (fp32 runs without tensor cores).
    pub fn peak_flops(&self, precision: Precision) -> f64 {
        if precision == Precision::Fp32 && self.tf32 {
            self.gpu.bf16_flops / 2.0
        } else if precision == Precision::Fp32 {
            self.gpu.fp32_flops
        } else {
            self.gpu.bf16_flops
        }
    }

    /// Checks that every speed is positive and the MFU a fraction.
    pub fn validate(&self) -> Result<(), PlanError> {
        let bad = |field: &str, reason: &str| PlanError::Invalid {
            field: field.into(),
            reason: reason.into(),
        };
        if !(self.mfu > 0.0 && self.mfu <= 1.0) {
            return Err(bad("--mfu", "must be in (0, 1]: e.g. 0.4 for 40% of peak"));
        }
        if self.gpus_per_node == 0 {
            return Err(bad("--gpus-per-node", "must be at least 1"));
        }
        let speeds = [
            ("--tflops", self.gpu.bf16_flops),
            ("--tflops", self.gpu.fp32_flops),
            ("--hbm-bandwidth", self.gpu.hbm_bytes_per_s),
            ("--link-bandwidth", self.gpu.intra_node_bytes_per_s),
            ("--inter-node-bandwidth", self.gpu.inter_node_bytes_per_s),
            ("--host-link-bandwidth", self.gpu.host_link_bytes_per_s),
            ("--host-adam-rate", self.host_adam_elems_per_s),
        ];
        for (field, v) in speeds {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, "must be a positive number"));
            }
        }
        Ok(())
    }
}
