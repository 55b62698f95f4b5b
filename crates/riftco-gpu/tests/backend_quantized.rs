//! A quantized frozen base on the GPU backend. Quantized tensors move CPU → GPU → CPU as their
//! bytes, bit for bit, for every format, counted on the GPU as exactly those bytes; the GPU's
//! products against a quantized weight (`x · Wᵀ`, `dY · W`, whole and in blocks of rows /
//! columns past the 4 MiB workspace) are bitwise its products against an f32 weight holding
//! the dequantized values, the one-row product (decoding's fused mat-vec) within its summation
//! bound of them, and embedding lookups bitwise the CPU's rows.
//!
//! A tiny LoRA model (vocab 64, 2 heads, 2 layers) whose frozen base is quantized — random
//! blocks with finite scales, built with `Tensor::from_quantized_bytes` — moved to the GPU:
//! its loss, every gradient and the parameters after one Adam step are within 1e-4 of each
//! tensor's largest magnitude of the same model on the CPU (the tolerance of the f32 model's
//! GPU-vs-CPU tests: the two devices' kernels sum in different orders; the quantized weights
//! are of the f32 model's magnitudes, at most 0.1), and bitwise those of the GPU model holding
//! the dequantized weights in f32 (the same kernels on the same values); checkpointing per
//! block is bitwise the plain run; K/V-cache decoding gives the CPU's logits within the same
//! tolerance at every position. Bad input (16-bit weights, a backend without quantized
//! buffers, other ops given a quantized tensor, gradients of it) are clear errors.

mod common;

use common::backend_or_skip;
use riftco_autograd::Variable;
use riftco_kernels::quant::{dequantize_range, QuantFormat};
use riftco_tensor::backend::MatmulSpec;
use riftco_tensor::{
    Buffer, Device, HalfDtype, MemoryCategory, QuantizedBytes, Tensor, TensorError,
    ThreadMemoryScope,
};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, LoraConfig, LoraTargets, TransformerConfig, WeightDtype,
    Weights,
};

/// xorshift64 bytes (deterministic, no external crate).
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// The f16 scale fields of a GGML block `(byte offset, largest factor it is multiplied by,
/// whether it is a subtracted minimum)` and the block's bytes.
fn scale_fields(format: QuantFormat) -> (&'static [(usize, f32, bool)], usize) {
    match format {
        QuantFormat::Q4_0 => (&[(0, 8.0, false)], 18),
        QuantFormat::Q4_1 => (&[(0, 15.0, false), (2, 2.0, true)], 20),
        QuantFormat::Q5_0 => (&[(0, 16.0, false)], 22),
        QuantFormat::Q5_1 => (&[(0, 31.0, false), (2, 2.0, true)], 24),
        QuantFormat::Q8_0 => (&[(0, 128.0, false)], 34),
        QuantFormat::Q2_K => (&[(80, 45.0, false), (82, 30.0, false)], 84),
        QuantFormat::Q3_K => (&[(108, 128.0, false)], 110),
        QuantFormat::Q4_K => (&[(0, 945.0, false), (2, 126.0, false)], 144),
        QuantFormat::Q5_K => (&[(0, 1953.0, false), (2, 126.0, false)], 176),
        QuantFormat::Q6_K => (&[(208, 4096.0, false)], 210),
        QuantFormat::Nf4 => unreachable!("NF4 has no f16 fields"),
    }
}

/// The storage of `numel` elements of `format`: random quants, each block's scales random
/// finite values sized so that no dequantized value exceeds about `bound`.
fn quant_storage(format: QuantFormat, numel: usize, seed: u64, bound: f32) -> Vec<u8> {
    let mut data = random_bytes(format.storage_bytes(numel).expect("whole blocks"), seed);
    let mut unit = {
        let mut s = (seed as u32).wrapping_mul(2_654_435_761) | 1;
        move || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            0.5 + 0.5 * (s >> 8) as f32 / (1u32 << 24) as f32
        }
    };
    if format == QuantFormat::Nf4 {
        // absmax = dynamic[q] · scale + offset, dynamic in [-1, 1]: within [0.2, 1] · bound.
        let blocks = numel / QuantFormat::NF4_BLOCK;
        let groups = blocks.div_ceil(QuantFormat::NF4_GROUP);
        let at = numel / 2 + blocks;
        for g in 0..groups {
            let s = 0.4 * bound * unit();
            data[at + 4 * g..at + 4 * g + 4].copy_from_slice(&s.to_le_bytes());
        }
        let offset = (0.6 * bound).to_le_bytes();
        data[at + 4 * groups..at + 4 * groups + 4].copy_from_slice(&offset);
        return data;
    }
    let (fields, block_bytes) = scale_fields(format);
    for block in data.chunks_exact_mut(block_bytes) {
        for &(at, factor, minimum) in fields {
            let v = bound / factor * unit() * if minimum { -1.0 } else { 1.0 };
            let h = HalfDtype::Float16.from_f32(v);
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    data
}

fn quantized(format: QuantFormat, rows: usize, cols: usize, seed: u64) -> Tensor {
    let bytes = quant_storage(format, rows * cols, seed, 0.1);
    Tensor::from_quantized_bytes(format, bytes, [rows, cols], MemoryCategory::Parameter).unwrap()
}

fn quant_bytes(t: &Tensor) -> Vec<u8> {
    match &*t.buffer() {
        Buffer::Quantized(q) => q.bytes.clone(),
        other => panic!("not a host quantized buffer: {other:?}"),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// This thread's bytes of `category` on `dev` (tests run in parallel threads).
fn scope(dev: Device, category: MemoryCategory) -> ThreadMemoryScope {
    ThreadMemoryScope::new(dev, category)
}

#[test]
fn quantized_tensors_move_to_the_gpu_and_back_bit_for_bit() {
    let Some(dev) = backend_or_skip("quantized_tensors_move_to_the_gpu_and_back_bit_for_bit")
    else {
        return;
    };
    for (i, format) in QuantFormat::ALL.into_iter().enumerate() {
        // 3 rows of 2 blocks of 256 (every block size divides 512); NF4 over 2 groups.
        let rows = if format == QuantFormat::Nf4 { 72 } else { 3 };
        let mut t = quantized(format, rows, 512, 40 + i as u64);
        let before = quant_bytes(&t);
        let values = t.to_host().unwrap();
        let storage = format.storage_bytes(rows * 512).unwrap() as i64;
        let gpu = scope(dev, MemoryCategory::Parameter);
        let cpu = scope(Device::Cpu, MemoryCategory::Parameter);
        t.transfer_to(dev).unwrap();
        assert_eq!(t.device(), dev);
        assert_eq!(t.quant_format(), Some(format), "{format}: still quantized");
        assert!(t.is_compressed(), "{format}");
        assert_eq!(
            gpu.current_bytes(),
            storage,
            "{format}: the GPU counts the quantized bytes"
        );
        assert_eq!(
            cpu.current_bytes(),
            -storage,
            "{format}: none left on the CPU"
        );
        // Read back as values: the CPU's dequantization of the same bytes.
        assert_eq!(
            bits(&t.to_host().unwrap()),
            bits(&values),
            "{format}: values"
        );
        // A copy on the device is the f32 values (as the CPU's copy is).
        let f = t.to_float32().unwrap();
        assert_eq!((f.device(), f.quant_format()), (dev, None), "{format}");
        assert_eq!(bits(&f.to_host().unwrap()), bits(&values), "{format}: copy");
        drop(f);
        t.transfer_to(Device::Cpu).unwrap();
        assert_eq!(
            quant_bytes(&t),
            before,
            "{format}: bytes after the round trip"
        );
        assert_eq!(gpu.current_bytes(), 0, "{format}");
        assert_eq!(cpu.current_bytes(), 0, "{format}");
    }
}

/// `op(A) · op(W)` on `dev` through the backend, as host values.
fn product(dev: Device, spec: MatmulSpec, a: &[f32], w: &Tensor) -> Vec<f32> {
    let mut a = Tensor::from_vec(a.to_vec(), [spec.m, spec.k], MemoryCategory::Activation).unwrap();
    a.transfer_to(dev).unwrap();
    let be = riftco_tensor::backend::for_device(dev).unwrap();
    be.matmul(
        "test",
        spec,
        &a,
        w,
        [spec.m, spec.n].into(),
        MemoryCategory::Activation,
    )
    .unwrap()
    .to_host()
    .unwrap()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    common::values(n, seed, -1.0, 1.0)
}

#[test]
fn products_against_a_quantized_weight_are_bitwise_the_gpu_f32_products() {
    let Some(dev) =
        backend_or_skip("products_against_a_quantized_weight_are_bitwise_the_gpu_f32_products")
    else {
        return;
    };
    // [64, 256] fits in one block (dequantized whole); [2112, 512] (1.08 M elements) does not:
    // x · Wᵀ runs in two blocks of rows, dY · W in two blocks of columns.
    let cases = [
        (QuantFormat::Q4_0, 64, 256),
        (QuantFormat::Q4_K, 64, 256),
        (QuantFormat::Nf4, 64, 256),
        (QuantFormat::Q8_0, 2112, 512),
        (QuantFormat::Q6_K, 2112, 512),
    ];
    for (i, (format, rows, cols)) in cases.into_iter().enumerate() {
        let mut q = quantized(format, rows, cols, 70 + i as u64);
        let mut f = Tensor::from_vec(
            q.to_host().unwrap(),
            [rows, cols],
            MemoryCategory::Parameter,
        )
        .unwrap();
        q.transfer_to(dev).unwrap();
        f.transfer_to(dev).unwrap();
        let ws = scope(dev, MemoryCategory::Workspace);
        let m = 3;
        // x · Wᵀ: W is [n = rows, k = cols].
        let spec = MatmulSpec::new(m, cols, rows).trans_b(true);
        let x = values(m * cols, 1 + i as u32);
        let (a, b) = (product(dev, spec, &x, &q), product(dev, spec, &x, &f));
        assert_eq!(bits(&a), bits(&b), "{format} [{rows}, {cols}]: x · Wᵀ");
        // dY · W: W is [k = rows, n = cols].
        let spec = MatmulSpec::new(m, rows, cols);
        let dy = values(m * rows, 2 + i as u32);
        let (a, b) = (product(dev, spec, &dy, &q), product(dev, spec, &dy, &f));
        assert_eq!(bits(&a), bits(&b), "{format} [{rows}, {cols}]: dY · W");
        // The dequantized blocks were workspace and are gone; none exceeded the bound
        // (4 MiB, plus the block products, [m, block] each).
        assert_eq!(ws.current_bytes(), 0, "{format}: workspace released");
        let bound = 4 * ((1 << 20) + m * rows.max(cols)) as i64;
        assert!(
            ws.peak_bytes() <= bound && ws.peak_bytes() > 0,
            "{format}: workspace peak {}, bound {bound}",
            ws.peak_bytes()
        );
        // One row (decoding): the fused mat-vec, within γ_k Σ|w x| of the f32 product
        // twice (each side within it of the exact sum).
        let spec = MatmulSpec::new(1, cols, rows).trans_b(true);
        let x1 = &x[..cols];
        let (a, b) = (product(dev, spec, x1, &q), product(dev, spec, x1, &f));
        let w = f.to_host().unwrap();
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = cols as f64 * u / (1.0 - cols as f64 * u);
        for r in 0..rows {
            let abs: f64 = (0..cols)
                .map(|c| f64::from((w[r * cols + c] * x1[c]).abs()))
                .sum();
            let diff = f64::from((a[r] - b[r]).abs());
            assert!(
                diff <= 2.0 * gamma * abs,
                "{format}: mat-vec row {r}: {} vs {} (bound {})",
                a[r],
                b[r],
                2.0 * gamma * abs
            );
        }
    }
}

#[test]
fn embedding_lookups_of_a_quantized_table_are_the_cpu_rows() {
    let Some(dev) = backend_or_skip("embedding_lookups_of_a_quantized_table_are_the_cpu_rows")
    else {
        return;
    };
    for (i, format) in [QuantFormat::Q5_1, QuantFormat::Q3_K, QuantFormat::Nf4]
        .into_iter()
        .enumerate()
    {
        let (vocab, d) = (300, 256);
        let mut t = quantized(format, vocab, d, 90 + i as u64);
        let ids = [7u32, 0, 299, 7, 150];
        let cpu = riftco_tensor::backend::for_device(Device::Cpu).unwrap();
        let want = cpu
            .embedding("test", &t, &ids, MemoryCategory::Activation)
            .unwrap()
            .to_host()
            .unwrap();
        t.transfer_to(dev).unwrap();
        let be = riftco_tensor::backend::for_device(dev).unwrap();
        let got = be
            .embedding("test", &t, &ids, MemoryCategory::Activation)
            .unwrap();
        assert_eq!(got.dims(), &[5, 256]);
        assert_eq!(bits(&got.to_host().unwrap()), bits(&want), "{format}");
        let e = be
            .embedding("test", &t, &[1, 300], MemoryCategory::Activation)
            .unwrap_err();
        assert!(
            matches!(
                e,
                TensorError::IndexOutOfRange {
                    index: 300,
                    bound: 300,
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// The tiny model's config: every matrix's rows are whole blocks of `format` (d_model and
/// d_ff multiples of its block).
fn config(format: QuantFormat, tied: bool) -> TransformerConfig {
    let d = format.block_elements().max(32);
    let mut c = TransformerConfig::new(64, d, 2, 2, 2 * d, 16);
    c.tie_word_embeddings = tied;
    c.seed = 11;
    c
}

/// A LoRA model whose frozen base matrices are `format` (random blocks), or, with
/// `dequantized`, the same values in f32 (frozen too); the RMSNorm gains stay f32. Rank-4
/// adapters on every projection, B filled with small non-zero values.
fn lora_model(
    format: QuantFormat,
    tied: bool,
    ck: Ck,
    dequantized: bool,
) -> DecoderOnlyTransformer {
    let c = config(format, tied);
    let rope = DecoderOnlyTransformer::new(c.clone(), Attn::Flash, Ck::Disabled)
        .unwrap()
        .weights()
        .rope
        .clone();
    let mut seed = 100;
    let w = Weights::try_from_entries(&c, rope, |e| {
        let shape = e.shape(&c);
        seed += 1;
        let t = match shape[..] {
            [rows, cols] => {
                let q = quantized(format, rows, cols, seed);
                match dequantized {
                    true => Tensor::from_vec(q.to_host()?, shape, MemoryCategory::Parameter)?,
                    false => q,
                }
            }
            _ => Tensor::try_ones(shape, MemoryCategory::Parameter)?,
        };
        Ok(Variable::named_leaf(t, false, e.hf_name()))
    })
    .unwrap();
    let mut m = DecoderOnlyTransformer::from_weights(w, Attn::Flash, ck);
    let l = LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets {
            attention: true,
            mlp: true,
        },
        seed: 3,
        dropout: 0.0,
    };
    m.enable_lora(&l).unwrap();
    for (_, p) in m.weights().named_lora_parameters() {
        let n = p.value().numel();
        let vals: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.01)
            .collect();
        p.value().copy_from_slice(&vals).unwrap();
    }
    assert_eq!(
        m.frozen_weights_dtype(),
        match dequantized {
            true => WeightDtype::Float32,
            false => WeightDtype::Quantized(format),
        }
    );
    m
}

fn block(batch: usize, seq_plus_one: usize, vocab: u32) -> Vec<u32> {
    (0..batch * seq_plus_one)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect()
}

/// `|got − want| ≤ 1e-4 · max |want|` element-wise (one scale per tensor).
fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale,
            "{what}[{i}]: gpu {g} vs cpu {w} (tolerance 1e-4 × max |cpu| {scale})"
        );
    }
}

/// One training step: the loss, the LoRA gradients and the LoRA parameters after one Adam step
/// (the frozen base has no gradient: checked).
type Step = (Vec<f32>, Vec<(String, Vec<f32>)>, Vec<Vec<f32>>);

fn step(m: &DecoderOnlyTransformer, tokens: &[u32], device: Device) -> Step {
    let mut opt = Adam::new(m.trainable_parameters(), LR).unwrap();
    let loss = m.loss(tokens, 2, 9).unwrap();
    assert_eq!(loss.value().device(), device);
    loss.backward().unwrap();
    for (name, p) in m.weights().named_base_parameters() {
        assert!(p.grad().is_none(), "frozen {name} has a gradient");
        assert_eq!(p.value().device(), device, "{name}");
    }
    let lora = m.weights().named_lora_parameters();
    let grads = lora
        .iter()
        .map(|(name, p)| {
            let g = p.grad().expect("a LoRA gradient");
            assert_eq!(g.device(), device, "gradient of {name}");
            (name.clone(), g.to_host().unwrap())
        })
        .collect();
    opt.step().unwrap();
    let after = lora
        .iter()
        .map(|(_, p)| p.value().to_host().unwrap())
        .collect();
    (loss.value().to_host().unwrap(), grads, after)
}

/// The learning rate of [`step`]'s Adam (PyTorch's other defaults: eps 1e-8).
const LR: f32 = 1e-2;
const EPS: f32 = 1e-8;

fn assert_steps_close(case: &str, gpu: &Step, cpu: &Step) {
    close(&format!("{case}: loss"), &gpu.0, &cpu.0);
    for ((name, c), (_, g)) in cpu.1.iter().zip(&gpu.1) {
        close(&format!("{case}: grad of {name}"), g, c);
    }
    // Adam's first step moves each parameter by `lr · φ(g)`, `φ(g) = g / (|g| + eps)`: a
    // gradient within `δ = 1e-4 · max |g|` of the CPU's moves it by at most
    // `lr · max |φ(g_cpu ± δ) − φ(g_cpu)|` more (φ is monotone), which is large where `|g|` is
    // near `eps`. The parameters are within that, plus the 1e-4 of their own magnitude.
    let phi = |g: f32| g / (g.abs() + EPS);
    for (((name, gc), pc), pg) in cpu.1.iter().zip(&cpu.2).zip(&gpu.2) {
        let delta = 1e-4 * gc.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scale = pc.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (i, ((&c, &g), &grad)) in pc.iter().zip(pg).zip(gc).enumerate() {
            let moved = (phi(grad + delta) - phi(grad))
                .abs()
                .max((phi(grad - delta) - phi(grad)).abs());
            let tol = 1e-4 * scale + LR * moved;
            assert!(
                (g - c).abs() <= tol,
                "{case}: {name} after Adam[{i}]: gpu {g} vs cpu {c} (gradient {grad}, \
                 tolerance {tol})"
            );
        }
    }
}

fn assert_steps_bitwise(case: &str, a: &Step, b: &Step) {
    assert_eq!(bits(&a.0), bits(&b.0), "{case}: loss");
    for ((name, x), (_, y)) in a.1.iter().zip(&b.1) {
        assert_eq!(bits(x), bits(y), "{case}: grad of {name}");
    }
    for (x, y) in a.2.iter().zip(&b.2) {
        assert_eq!(bits(x), bits(y), "{case}: LoRA parameters after Adam");
    }
}

#[test]
fn a_lora_model_on_a_quantized_base_trains_on_the_gpu_like_the_cpu() {
    let Some(dev) =
        backend_or_skip("a_lora_model_on_a_quantized_base_trains_on_the_gpu_like_the_cpu")
    else {
        return;
    };
    let tokens = block(2, 9, 64);
    for (format, tied) in [
        (QuantFormat::Q4_0, false),
        (QuantFormat::Q8_0, true),
        (QuantFormat::Nf4, false),
        (QuantFormat::Q4_K, true),
    ] {
        let case = format!("{format}, tied {tied}");
        let cpu = lora_model(format, tied, Ck::Disabled, false);
        let mut gpu = lora_model(format, tied, Ck::Disabled, false);
        let mut gpu_ck = lora_model(format, tied, Ck::TransformerBlock, false);
        let mut gpu_f32 = lora_model(format, tied, Ck::Disabled, true);
        let param_bytes: i64 = gpu
            .weights()
            .named_base_parameters()
            .iter()
            .chain(&gpu.weights().named_lora_parameters())
            .map(|(_, p)| match p.value().quant_format() {
                Some(f) => f.storage_bytes(p.value().numel()).unwrap() as i64,
                None => 4 * p.value().numel() as i64,
            })
            .sum();
        let on_gpu = scope(dev, MemoryCategory::Parameter);
        gpu.to_device(dev).unwrap();
        assert_eq!(
            on_gpu.current_bytes(),
            param_bytes,
            "{case}: parameter bytes on {dev} (quantized bytes + f32 gains and adapters)"
        );
        assert_eq!(gpu.frozen_weights_dtype(), WeightDtype::Quantized(format));
        gpu_ck.to_device(dev).unwrap();
        gpu_f32.to_device(dev).unwrap();
        let sc = step(&cpu, &tokens, Device::Cpu);
        let sg = step(&gpu, &tokens, dev);
        assert_steps_close(&format!("{case}: gpu vs cpu"), &sg, &sc);
        let sf = step(&gpu_f32, &tokens, dev);
        assert_steps_bitwise(
            &format!("{case}: quantized vs dequantized f32 on {dev}"),
            &sg,
            &sf,
        );
        let sk = step(&gpu_ck, &tokens, dev);
        assert_steps_bitwise(&format!("{case}: checkpointed vs plain on {dev}"), &sk, &sg);
    }
}

#[test]
fn decoding_a_quantized_base_on_the_gpu_matches_the_cpu_at_every_position() {
    let Some(dev) =
        backend_or_skip("decoding_a_quantized_base_on_the_gpu_matches_the_cpu_at_every_position")
    else {
        return;
    };
    for (format, tied) in [(QuantFormat::Q4_1, true), (QuantFormat::Q6_K, false)] {
        let cpu = lora_model(format, tied, Ck::Disabled, false);
        let mut gpu = lora_model(format, tied, Ck::Disabled, false);
        gpu.to_device(dev).unwrap();
        let (mut sc, mut sg) = (cpu.decode_session().unwrap(), gpu.decode_session().unwrap());
        for (pos, &t) in block(1, 12, 64).iter().enumerate() {
            let (a, b) = (sc.decode_token(t).unwrap(), sg.decode_token(t).unwrap());
            close(
                &format!("{format}: decode logits at position {pos}"),
                &b,
                &a,
            );
        }
    }
}

#[test]
fn frozen_dtype_changes_on_the_gpu_and_bad_input_are_clear() {
    let Some(dev) = backend_or_skip("frozen_dtype_changes_on_the_gpu_and_bad_input_are_clear")
    else {
        return;
    };
    let format = QuantFormat::Q8_0;
    let mut m = lora_model(format, false, Ck::Disabled, false);
    m.to_device(dev).unwrap();
    // 16-bit storage lives on the CPU only.
    let e = m
        .set_frozen_weights_dtype(WeightDtype::BFloat16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bfloat16") && e.contains("CPU only"), "{e}");
    assert_eq!(m.frozen_weights_dtype(), WeightDtype::Quantized(format));
    // Another quantized format: quantized on the CPU, or the quantizer's own error (the model
    // unchanged).
    match m.set_frozen_weights_dtype(WeightDtype::Quantized(QuantFormat::Q4_0)) {
        Ok(()) => {
            assert_eq!(
                m.frozen_weights_dtype(),
                WeightDtype::Quantized(QuantFormat::Q4_0)
            );
            m.set_frozen_weights_dtype(WeightDtype::Quantized(format))
                .unwrap();
        }
        Err(e) => {
            assert!(e.to_string().contains("q4_0"), "{e}");
            assert_eq!(m.frozen_weights_dtype(), WeightDtype::Quantized(format));
        }
    }
    // A gradient of the quantized head is refused, as on the CPU.
    let head = m.weights().lm_head.value().clone();
    assert_eq!(head.device(), dev);
    let be = riftco_tensor::backend::for_device(dev).unwrap();
    let mut x = Tensor::zeros([2, head.dims()[1]], MemoryCategory::Activation);
    x.transfer_to(dev).unwrap();
    let e = be
        .linear_cross_entropy(
            "test",
            &x,
            &head,
            &[1, 2],
            2,
            [true, true],
            MemoryCategory::Activation,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("quantized (q8_0") && e.contains("read-only"),
        "{e}"
    );
    // An op without a quantized path names the format.
    let e = be
        .add("test", &head, &head, MemoryCategory::Activation)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("stored quantized (q8_0)") && e.contains("float32"),
        "{e}"
    );
    // float32 dequantizes on the device: the values of the quantized weights, bit for bit.
    let want: Vec<Vec<u32>> = m
        .weights()
        .named_base_parameters()
        .iter()
        .map(|(_, p)| bits(&p.value().to_host().unwrap()))
        .collect();
    m.set_frozen_weights_dtype(WeightDtype::Float32).unwrap();
    assert_eq!(m.frozen_weights_dtype(), WeightDtype::Float32);
    for ((name, p), w) in m.weights().named_base_parameters().iter().zip(&want) {
        assert_eq!(p.value().device(), dev, "{name}");
        assert_eq!(p.value().quant_format(), None, "{name}");
        assert_eq!(&bits(&p.value().to_host().unwrap()), w, "{name}");
    }
    // A 16-bit base stays on the CPU, with a message saying so.
    let mut h = lora_model(format, false, Ck::Disabled, true);
    h.set_frozen_weights_dtype(WeightDtype::BFloat16).unwrap();
    let e = h.to_device(dev).unwrap_err().to_string();
    assert!(
        e.contains("bfloat16") && e.contains("CPU only") && e.contains("quantized"),
        "{e}"
    );
    assert_eq!(h.device(), Device::Cpu);
}

#[test]
fn a_backend_without_quantized_buffers_refuses_them_clearly() {
    // The mirror test backend keeps f32 buffers only (no GPU needed).
    riftco_tensor::backend::mirror::install();
    let mut t = quantized(QuantFormat::Q4_0, 2, 64, 5);
    let before = quant_bytes(&t);
    let e = t.transfer_to(Device::PrivateUse1).unwrap_err().to_string();
    assert!(
        e.contains("cannot hold a tensor stored quantized (q4_0)") && e.contains("float32"),
        "{e}"
    );
    assert_eq!(t.device(), Device::Cpu);
    assert_eq!(quant_bytes(&t), before);
    let q = QuantizedBytes {
        format: QuantFormat::Q4_0,
        bytes: before,
        numel: 128,
    };
    let be = riftco_tensor::backend::for_device(Device::PrivateUse1).unwrap();
    assert!(be.upload_quantized("test", &q).is_err());
    // A model: the parameters moved before the quantized one are moved back.
    let mut m = lora_model(QuantFormat::Q8_0, false, Ck::Disabled, false);
    let e = m.to_device(Device::PrivateUse1).unwrap_err().to_string();
    assert!(e.contains("stored quantized (q8_0)"), "{e}");
    let mut all = m.weights().named_base_parameters();
    all.extend(m.weights().named_lora_parameters());
    for (name, p) in all {
        assert_eq!(p.value().device(), Device::Cpu, "{name} moved back");
    }
    assert_eq!(
        m.frozen_weights_dtype(),
        WeightDtype::Quantized(QuantFormat::Q8_0)
    );
}

#[test]
fn dequantized_values_in_tests_are_finite_and_of_the_stated_size() {
    // The generator above: every format's values finite, at most about 0.1, not all tiny.
    for (i, format) in QuantFormat::ALL.into_iter().enumerate() {
        let n = 64 * 256;
        let bytes = quant_storage(format, n, 7 + i as u64, 0.1);
        let mut v = vec![0.0f32; n];
        dequantize_range(format, &bytes, n, 0, &mut v).unwrap();
        let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(v.iter().all(|x| x.is_finite()), "{format}");
        assert!((0.02..=0.15).contains(&max), "{format}: max |value| {max}");
    }
}
