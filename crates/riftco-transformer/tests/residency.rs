//! Parameter residency (the seam of sharded data parallelism): a model whose parameters are
//! released between uses and restored from their bytes by an owner computes bitwise what the
//! always-resident model computes, under every policy, full and LoRA, tied and untied; the owner
//! is asked in the documented order; released storage is really freed; a value that changes
//! between the forward run and the replay is a stale graph.

mod common;

use common::{block, lora_config};
use riftco_autograd::{AutogradError, BackwardOptions, Variable};
use riftco_tensor::StorageEncoding;
use riftco_transformer::{
    AcquireReason, ActivationCheckpointing, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, ParameterResidency, ResidencyUnit, TransformerConfig,
    TransformerError,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const BATCH: usize = 2;
const SEQ: usize = 10;
const LAYERS: usize = 4;

fn config(tied: bool) -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 64, 4, LAYERS, 128, 16);
    c.n_kv_heads = 2;
    c.seed = 13;
    c.tie_word_embeddings = tied;
    c
}

fn model(policy: &str, lora: bool, tied: bool) -> DecoderOnlyTransformer {
    let policy: ActivationCheckpointing = policy.parse().unwrap();
    let mut m = DecoderOnlyTransformer::new(config(tied), Attn::Flash, policy).unwrap();
    if lora {
        m.enable_lora(&lora_config()).unwrap();
        for (_, p) in m.weights().named_lora_parameters() {
            let n = p.value().numel();
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 29 % 13) as f32 - 6.0) * 0.01)
                .collect();
            p.value().copy_from_slice(&v).unwrap();
        }
    }
    m
}

/// Every parameter of the model (base and adapters) with its name.
fn all_parameters(m: &DecoderOnlyTransformer) -> Vec<(String, Variable)> {
    let mut v = m.named_parameters();
    v.extend(m.weights().named_lora_parameters());
    v
}

/// A parameter, its encoding and its bytes while released.
type Held = (Variable, StorageEncoding, Mutex<Vec<u8>>);

/// An owner that keeps each unit's bytes in memory (a transport of one process) and logs
/// every call.
struct Keeper {
    units: HashMap<ResidencyUnit, Vec<Held>>,
    /// The holds of each gathered unit (every acquire must be matched by one release).
    resident: Mutex<HashMap<ResidencyUnit, usize>>,
    log: Mutex<Vec<String>>,
    /// Rows per slice in which the embedding and the head are given (none: whole).
    slice: Mutex<Option<usize>>,
}

impl Keeper {
    /// Takes the bytes of every parameter and releases them all.
    fn take(m: &DecoderOnlyTransformer) -> Arc<Self> {
        let mut units: HashMap<ResidencyUnit, Vec<_>> = HashMap::new();
        for (name, p) in all_parameters(m) {
            let unit = ResidencyUnit::of_parameter(&name).unwrap();
            let encoding = p.value().storage_encoding().unwrap().unwrap();
            let bytes = p.value().encoded_bytes().unwrap();
            p.value().release_shared();
            units
                .entry(unit)
                .or_default()
                .push((p, encoding, Mutex::new(bytes)));
        }
        Arc::new(Self {
            units,
            resident: Mutex::new(HashMap::new()),
            log: Mutex::new(Vec::new()),
            slice: Mutex::new(None),
        })
    }

    fn release_all(&self) {
        let resident: HashMap<_, _> = std::mem::take(&mut *self.resident.lock().unwrap());
        for unit in resident.into_keys() {
            for (p, _, _) in &self.units[&unit] {
                p.value().release_shared();
            }
        }
    }

    /// Whether every acquire so far was matched by a release.
    fn balanced(&self) -> bool {
        self.resident.lock().unwrap().is_empty()
    }

    fn log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

impl ParameterResidency for Keeper {
    fn acquire(
        &self,
        unit: ResidencyUnit,
        reason: AcquireReason,
        next: Option<ResidencyUnit>,
    ) -> riftco_autograd::Result<()> {
        let next = next.map_or_else(|| "-".to_string(), |n| n.prefix());
        self.log
            .lock()
            .unwrap()
            .push(format!("+{unit} {} {next}", reason.name()));
        let mut resident = self.resident.lock().unwrap();
        let holds = resident.entry(unit).or_insert(0);
        if *holds == 0 {
            for (p, encoding, bytes) in &self.units[&unit] {
                p.value()
                    .restore_encoded(*encoding, &bytes.lock().unwrap())?;
            }
        }
        *holds += 1;
        Ok(())
    }

    fn release(&self, unit: ResidencyUnit) {
        self.log.lock().unwrap().push(format!("-{unit}"));
        let mut resident = self.resident.lock().unwrap();
        let holds = resident.get_mut(&unit);
        let holds = holds.unwrap_or_else(|| panic!("{unit} released without a hold"));
        *holds -= 1;
        if *holds == 0 {
            resident.remove(&unit);
            for (p, _, _) in &self.units[&unit] {
                p.value().release_shared();
            }
        }
    }

    fn row_slice(&self, unit: ResidencyUnit) -> Option<usize> {
        let sliceable = matches!(unit, ResidencyUnit::Embedding | ResidencyUnit::Head)
            && self.units[&unit].len() == 1;
        (*self.slice.lock().unwrap()).filter(|_| sliceable)
    }

    fn fetch_rows(
        &self,
        unit: ResidencyUnit,
        rows: std::ops::Range<usize>,
        next: Option<ResidencyUnit>,
    ) -> riftco_autograd::Result<riftco_tensor::Tensor> {
        let next = next.map_or_else(|| "-".to_string(), |n| n.prefix());
        self.log
            .lock()
            .unwrap()
            .push(format!("~{unit} {}..{} {next}", rows.start, rows.end));
        let (p, encoding, bytes) = &self.units[&unit][0];
        let [vocab, d] = p.dims() else {
            panic!("{unit} is not a table")
        };
        let bytes = bytes.lock().unwrap();
        let row = bytes.len() / vocab;
        Ok(riftco_tensor::Tensor::from_encoded(
            *encoding,
            &bytes[rows.start * row..rows.end * row],
            [rows.len(), *d],
            riftco_tensor::MemoryCategory::Parameter,
        )?)
    }
}

fn bits(t: &riftco_tensor::Tensor) -> Vec<u32> {
    t.read().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Loss bits and gradient bits of each trainable parameter, for two Adam steps.
fn train(m: &DecoderOnlyTransformer, keeper: Option<&Keeper>) -> Vec<Vec<u32>> {
    let params = m.trainable_parameters();
    let mut out = Vec::new();
    let mut opt = Adam::new(params.clone(), 1e-2).unwrap();
    for step in 0..2 {
        let tokens: Vec<u32> = block(BATCH, SEQ + 1, 64)
            .iter()
            .map(|t| (t + step * 5) % 64)
            .collect();
        let loss = m.loss(&tokens, BATCH, SEQ + 1).unwrap();
        out.push(bits(loss.value()));
        loss.backward().unwrap();
        drop(loss);
        if let Some(k) = keeper {
            assert!(k.balanced(), "{:?}", k.resident.lock().unwrap());
        }
        for p in &params {
            out.push(bits(&p.grad().unwrap()));
        }
        // The owner restores everything for the optimizer (a sharded run updates its shards
        // instead) and takes the new values back.
        if let Some(k) = keeper {
            k.release_all();
            for unit in k.units.keys() {
                k.acquire(*unit, AcquireReason::Forward, None).unwrap();
            }
        }
        opt.step().unwrap();
        opt.zero_grad().unwrap();
        if let Some(k) = keeper {
            // Adam wrote new values: the owner keeps them.
            for params in k.units.values() {
                for (p, _, bytes) in params {
                    *bytes.lock().unwrap() = p.value().encoded_bytes().unwrap();
                }
            }
            k.release_all();
        }
    }
    out
}

const POLICIES: [&str; 5] = [
    "disabled",
    "block",
    "segments:3",
    "selective",
    "disabled,block,selective:attention_ffn,block",
];

#[test]
fn a_released_model_trains_bitwise_like_a_resident_one() {
    for tied in [false, true] {
        for lora in [false, true] {
            for policy in POLICIES {
                let want = train(&model(policy, lora, tied), None);
                let mut m = model(policy, lora, tied);
                let keeper = Keeper::take(&m);
                m.set_parameter_residency(Some(keeper.clone()));
                let got = train(&m, Some(&keeper));
                assert!(
                    got == want,
                    "{policy}, lora {lora}, tied {tied}: losses or gradients differ"
                );
            }
        }
    }
}

/// The owner's log of a forward pass up to the final norm: the embedding, then every block,
/// each naming the next unit.
fn forward_events() -> Vec<String> {
    let mut events = vec![
        "+model.embed_tokens forward model.layers.0".to_string(),
        "-model.embed_tokens".into(),
    ];
    for i in 0..LAYERS {
        let next = if i + 1 < LAYERS {
            format!("model.layers.{}", i + 1)
        } else {
            "model.norm".into()
        };
        events.push(format!("+model.layers.{i} forward {next}"));
        events.push(format!("-model.layers.{i}"));
    }
    events
}

/// The owner's log of the blocks in a backward pass, acquired for `reason`, last block first.
fn backward_events(reason: &str) -> Vec<String> {
    let mut events = Vec::new();
    for i in (0..LAYERS).rev() {
        let next = if i > 0 {
            format!("model.layers.{}", i - 1)
        } else {
            "-".into()
        };
        events.push(format!("+model.layers.{i} {reason} {next}"));
        events.push(format!("-model.layers.{i}"));
    }
    events
}

#[test]
fn the_owner_is_asked_in_the_documented_order() {
    let mut m = model("block", false, false);
    let keeper = Keeper::take(&m);
    m.set_parameter_residency(Some(keeper.clone()));
    let tokens = block(BATCH, SEQ + 1, 64);
    let loss = m.loss(&tokens, BATCH, SEQ + 1).unwrap();
    let mut want = forward_events();
    want.push("+model.norm kept_for_backward lm_head".into());
    want.push("+lm_head kept_for_backward -".into());
    assert_eq!(keeper.log(), want);
    // After the forward only the norm and the head hold their values.
    for (name, p) in all_parameters(&m) {
        let kept = name.starts_with("model.norm.") || name.starts_with("lm_head.");
        assert_eq!(!p.value().is_placeholder(), kept, "{name}");
    }
    loss.backward_with(BackwardOptions::freeing()).unwrap();
    // The head and the norm go once their VJPs ran; each block is gathered for its replay.
    let mut want = vec!["-lm_head".to_string(), "-model.norm".into()];
    want.extend(backward_events("replay"));
    assert_eq!(keeper.log(), want);

    // `disabled`: each block is released after its forward although its graph holds its
    // tensors, and gathered again when the backward pass reaches it; the tied head is the
    // embedding, kept until the head's VJP.
    let mut m = model("disabled", false, true);
    let keeper = Keeper::take(&m);
    m.set_parameter_residency(Some(keeper.clone()));
    let loss = m.loss(&tokens, BATCH, SEQ + 1).unwrap();
    let mut want = forward_events();
    want.push("+model.norm kept_for_backward model.embed_tokens".into());
    want.push("+model.embed_tokens kept_for_backward -".into());
    assert_eq!(keeper.log(), want);
    let blocks: Vec<_> = all_parameters(&m)
        .into_iter()
        .filter(|(n, _)| n.starts_with("model.layers."))
        .collect();
    assert!(blocks.iter().all(|(_, p)| p.value().is_placeholder()));
    loss.backward_with(BackwardOptions::freeing()).unwrap();
    let mut want = vec!["-model.embed_tokens".to_string(), "-model.norm".into()];
    want.extend(backward_events("backward"));
    assert_eq!(keeper.log(), want);
    drop(loss);
    assert!(keeper.balanced());
    assert!(all_parameters(&m)
        .iter()
        .all(|(_, p)| p.value().is_placeholder()));

    // Without a graph every unit is released after its use.
    let logits = riftco_autograd::no_grad(|| m.logits(&tokens[..SEQ], 1, SEQ)).unwrap();
    assert_eq!(logits.dims(), &[SEQ, 64]);
    let log = keeper.log();
    let acquired = log.iter().filter(|e| e.starts_with('+')).count();
    let released = log.iter().filter(|e| e.starts_with('-')).count();
    assert_eq!((acquired, released), (LAYERS + 3, LAYERS + 3), "{log:?}");
    assert!(keeper.balanced());

    // Two forward passes before their backward passes (gradient accumulation by hand): the
    // holds add up; a graph dropped without a backward pass gives its holds back; a retaining
    // backward pass keeps them until the graph goes.
    let (a, b) = (
        m.loss(&tokens, BATCH, SEQ + 1).unwrap(),
        m.loss(&tokens, BATCH, SEQ + 1).unwrap(),
    );
    let dropped = m.loss(&tokens, BATCH, SEQ + 1).unwrap();
    assert_eq!(
        keeper.resident.lock().unwrap()[&ResidencyUnit::Embedding],
        3
    );
    drop(dropped);
    a.backward_with(BackwardOptions::freeing()).unwrap();
    assert!(!keeper.balanced());
    b.backward().unwrap();
    b.backward().unwrap();
    assert!(!keeper.balanced());
    drop((a, b));
    assert!(keeper.balanced());
}

#[test]
fn a_value_changed_between_forward_and_replay_is_a_stale_graph() {
    let mut m = model("block", false, false);
    let keeper = Keeper::take(&m);
    m.set_parameter_residency(Some(keeper.clone()));
    let loss = m.loss(&block(BATCH, SEQ + 1, 64), BATCH, SEQ + 1).unwrap();
    // The shards of block 1 change (an optimizer step between forward and backward): the
    // owner bumps the versions of its released tensors.
    for (p, _, _) in &keeper.units[&ResidencyUnit::Block(1)] {
        p.value().bump_version();
    }
    let e = loss.backward().unwrap_err();
    assert!(matches!(e, AutogradError::StaleGraph { .. }), "{e}");
}

#[test]
fn measured_policies_are_refused_under_an_owner() {
    for policy in ["auto", "budget:64MiB"] {
        let mut m = model(policy, false, false);
        let keeper = Keeper::take(&m);
        m.set_parameter_residency(Some(keeper));
        let e = m
            .loss(&block(BATCH, SEQ + 1, 64), BATCH, SEQ + 1)
            .unwrap_err();
        assert!(
            matches!(&e, TransformerError::Config { field, .. } if *field == "activation_checkpointing")
                && e.to_string().contains("sharded parameters"),
            "{policy}: {e}"
        );
    }
}

#[test]
fn a_frozen_base_in_16_bits_or_quantized_is_released_and_restored_as_stored() {
    use riftco_tensor::QuantFormat;
    use riftco_transformer::WeightDtype;
    let dtypes = [
        WeightDtype::BFloat16,
        WeightDtype::Quantized(QuantFormat::Q8_0),
        WeightDtype::Quantized(QuantFormat::Nf4),
    ];
    for dtype in dtypes {
        for policy in ["disabled", "block"] {
            let make = || {
                let mut m = model(policy, true, false);
                m.set_frozen_weights_dtype(dtype).unwrap();
                m
            };
            let want = train(&make(), None);
            let mut m = make();
            let keeper = Keeper::take(&m);
            let encodings: Vec<&str> = keeper
                .units
                .values()
                .flatten()
                .map(|(_, e, _)| e.name())
                .collect();
            assert!(encodings.contains(&dtype.name()), "{encodings:?}");
            m.set_parameter_residency(Some(keeper.clone()));
            let got = train(&m, Some(&keeper));
            assert!(
                got == want,
                "{dtype:?}, {policy}: losses or gradients differ"
            );
        }
    }
}

#[test]
fn saving_a_released_model_gathers_one_unit_at_a_time_and_writes_the_same_bytes() {
    let dir = std::env::temp_dir().join(format!("riftco-residency-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for lora in [false, true] {
        let want_model = model("block", lora, false);
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        riftco_transformer::save_model(&want_model, &a.join("model.safetensors")).unwrap();
        let mut m = model("block", lora, false);
        let keeper = Keeper::take(&m);
        m.set_parameter_residency(Some(keeper.clone()));
        riftco_transformer::save_model(&m, &b.join("model.safetensors")).unwrap();
        let log = keeper.log();
        let mut want = vec![
            "+model.embed_tokens forward -".to_string(),
            "-model.embed_tokens".into(),
        ];
        for i in 0..LAYERS {
            want.push(format!("+model.layers.{i} forward -"));
            want.push(format!("-model.layers.{i}"));
        }
        want.extend(
            [
                "+model.norm forward -",
                "-model.norm",
                "+lm_head forward -",
                "-lm_head",
            ]
            .map(String::from),
        );
        assert_eq!(log, want);
        assert!(all_parameters(&m)
            .iter()
            .all(|(_, p)| p.value().is_placeholder()));
        for file in ["model.safetensors", "config.json"] {
            assert_eq!(
                std::fs::read(a.join(file)).unwrap(),
                std::fs::read(b.join(file)).unwrap(),
                "{file}"
            );
        }
        if lora {
            riftco_transformer::save_lora_adapter(&want_model, &a.join("adapter")).unwrap();
            riftco_transformer::save_lora_adapter(&m, &b.join("adapter")).unwrap();
            let log = keeper.log();
            assert_eq!(log.len(), 2 * LAYERS, "{log:?}");
            for file in ["adapter_model.safetensors", "adapter_config.json"] {
                assert_eq!(
                    std::fs::read(a.join("adapter").join(file)).unwrap(),
                    std::fs::read(b.join("adapter").join(file)).unwrap(),
                    "{file}"
                );
            }
        }
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn changing_a_sharded_model_is_refused_naming_what_to_do() {
    let mut m = model("block", true, false);
    let keeper = Keeper::take(&m);
    m.set_parameter_residency(Some(keeper));
    let dir = std::env::temp_dir();
    let errors = [
        m.merge_lora().unwrap_err(),
        m.set_lora_active(false).unwrap_err(),
        m.enable_lora(&lora_config()).unwrap_err(),
        m.set_frozen_weights_dtype(riftco_transformer::WeightDtype::BFloat16)
            .unwrap_err(),
        m.to_device(riftco_tensor::Device::Cpu).unwrap_err(),
        riftco_transformer::load_weights_into(&m, &dir.join("none.safetensors")).unwrap_err(),
    ];
    for e in errors {
        let text = e.to_string();
        assert!(
            matches!(e, TransformerError::Config { field, .. } if field == "parameter_residency")
                && text.contains("ZeRO-3")
                && text.contains("detach"),
            "{text}"
        );
    }
}

/// The largest difference between `got` and `want` (f32 bit patterns) relative to `want`'s
/// largest magnitude.
fn relative_difference(got: &[u32], want: &[u32]) -> f64 {
    let f = |b: &u32| f64::from(f32::from_bits(*b));
    let scale = want.iter().map(|b| f(b).abs()).fold(1e-30, f64::max);
    got.iter()
        .zip(want)
        .map(|(a, b)| (f(a) - f(b)).abs())
        .fold(0.0, f64::max)
        / scale
}

#[test]
fn a_frozen_table_given_by_slices_trains_like_the_whole_table() {
    use riftco_tensor::QuantFormat;
    use riftco_transformer::WeightDtype;
    // The logits are products over d_model = 64 terms, which the sliced and the whole-table
    // kernels may sum in another order (each within γ_64 of the exact sum, Higham 2002, §3.1),
    // and the logsumexp is combined per slice: losses and gradients agree within a small
    // multiple of d_model · ε relative to their magnitude (here 4 · 64 · 2^-23 ≈ 3e-5).
    let tol = 4.0 * 64.0 * f64::from(f32::EPSILON);
    for dtype in [
        WeightDtype::BFloat16,
        WeightDtype::Quantized(QuantFormat::Q8_0),
    ] {
        for tied in [true, false] {
            for slice in [7usize, 64] {
                let make = || {
                    let mut m = model("block", true, tied);
                    m.set_frozen_weights_dtype(dtype).unwrap();
                    m
                };
                let want = train(&make(), None);
                let mut m = make();
                let keeper = Keeper::take(&m);
                *keeper.slice.lock().unwrap() = Some(slice);
                m.set_parameter_residency(Some(keeper.clone()));
                let got = train(&m, Some(&keeper));
                assert_eq!(got.len(), want.len());
                // The first step's loss and gradients (the second step's start from weights
                // that Adam moved by g / sqrt(v): a relative difference of a gradient near 0
                // is not bounded by the products' rounding).
                let first_step = got.len() / 2;
                for (i, (g, w)) in got.iter().zip(&want).take(first_step).enumerate() {
                    let diff = relative_difference(g, w);
                    assert!(
                        diff <= tol,
                        "{dtype:?}, tied {tied}, slice {slice}: item {i} differs by {diff:e} > {tol:e}"
                    );
                }
                // Neither table was acquired whole; every slice was fetched in order, for
                // the lookup (naming the first block after the last) and for the loss.
                let log = keeper.log();
                let head = if tied {
                    "model.embed_tokens"
                } else {
                    "lm_head"
                };
                // (train() itself acquires every unit for the optimizer: "forward -".)
                assert!(
                    !log.iter().any(|e| (e.starts_with(&format!("+{head} "))
                        || e.starts_with("+model.embed_tokens "))
                        && !e.ends_with(" forward -")),
                    "{log:?}"
                );
                let mut lookup: Vec<String> = (0..64)
                    .step_by(slice)
                    .map(|s| format!("~model.embed_tokens {s}..{} -", (s + slice).min(64)))
                    .collect();
                if let Some(last) = lookup.last_mut() {
                    *last = last.replace(" -", " model.layers.0");
                }
                let loss: Vec<String> = (0..64)
                    .step_by(slice)
                    .map(|s| format!("~{head} {s}..{} -", (s + slice).min(64)))
                    .collect();
                let fetches: Vec<String> =
                    log.iter().filter(|e| e.starts_with('~')).cloned().collect();
                let step: Vec<String> = [lookup, loss].concat();
                assert_eq!(
                    fetches,
                    [step.clone(), step].concat(),
                    "{dtype:?}, tied {tied}"
                );
            }
        }
    }
}
