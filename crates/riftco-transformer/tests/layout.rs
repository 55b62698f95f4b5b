//! The parameter-layout table against the model it describes: Hugging Face names and shapes,
//! initialisation order and rules, and LoRA targeting all follow `layout::PARAMETERS`.

use riftco_tensor::{MemoryCategory, Rng, Tensor};
use riftco_transformer::layout::{self, Init, Role};
use riftco_transformer::state::expected_base_shapes;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, LoraTargets, TransformerConfig,
};

fn config() -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 16, 2, 2, 24, 8);
    c.seed = 11;
    c
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|x| x.to_bits()).collect()
}

/// The `LlamaForCausalLM` state dict of a 2-block model, spelled out independently of the table.
#[test]
fn names_and_shapes_are_the_hugging_face_llama_state_dict() {
    let (v, d, ff) = (64, 16, 24);
    let mut want: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![v, d])];
    for i in 0..2 {
        let p = format!("model.layers.{i}");
        want.extend([
            (format!("{p}.input_layernorm.weight"), vec![d]),
            (format!("{p}.self_attn.q_proj.weight"), vec![d, d]),
            (format!("{p}.self_attn.k_proj.weight"), vec![d, d]),
            (format!("{p}.self_attn.v_proj.weight"), vec![d, d]),
            (format!("{p}.self_attn.o_proj.weight"), vec![d, d]),
            (format!("{p}.post_attention_layernorm.weight"), vec![d]),
            (format!("{p}.mlp.gate_proj.weight"), vec![ff, d]),
            (format!("{p}.mlp.up_proj.weight"), vec![ff, d]),
            (format!("{p}.mlp.down_proj.weight"), vec![d, ff]),
        ]);
    }
    want.push(("model.norm.weight".into(), vec![d]));
    want.push(("lm_head.weight".into(), vec![v, d]));

    let from_table: Vec<_> = layout::entries(2)
        .map(|e| (e.hf_name(), e.shape(&config())))
        .collect();
    assert_eq!(from_table, want);
    assert_eq!(expected_base_shapes(&config()), want);
    let m = DecoderOnlyTransformer::new(config(), Attn::Flash, Ck::Disabled).unwrap();
    let named: Vec<_> = m
        .named_parameters()
        .into_iter()
        .map(|(n, p)| {
            assert_eq!(p.name().as_deref(), Some(n.as_str()), "leaf name");
            (n, p.dims().to_vec())
        })
        .collect();
    assert_eq!(named, want);
}

/// Each parameter follows its row's init rule, drawn from one generator in table order.
#[test]
fn initialisation_follows_each_rows_rule_in_table_order() {
    let c = config();
    let m = DecoderOnlyTransformer::new(c.clone(), Attn::Flash, Ck::Disabled).unwrap();
    let mut rng = Rng::new(c.seed);
    let params = m.named_parameters();
    let entries: Vec<_> = layout::entries(c.n_layers).collect();
    assert_eq!(params.len(), entries.len());
    for ((name, p), e) in params.iter().zip(&entries) {
        let want = match e.parameter.init {
            Init::Normal { std } => {
                assert_eq!(std, 0.02, "{name}");
                Tensor::randn_with(e.shape(&c), 0.0, std, &mut rng, MemoryCategory::Workspace)
            }
            Init::Ones => Tensor::ones(e.shape(&c), MemoryCategory::Workspace),
        };
        assert_eq!(bits(p.value()), bits(&want), "{name}");
        assert_eq!(
            e.parameter.role == Role::Norm,
            name.ends_with("norm.weight"),
            "{name}"
        );
    }
}

/// `enable_lora` adapts exactly the rows whose role the targets select, with PEFT names, and
/// the adapter config lists their PEFT modules.
#[test]
fn lora_adapts_exactly_the_targeted_roles() {
    for (attention, mlp) in [(true, false), (false, true), (true, true)] {
        let targets = LoraTargets { attention, mlp };
        let mut m = DecoderOnlyTransformer::new(config(), Attn::Flash, Ck::Disabled).unwrap();
        let lora = LoraConfig {
            rank: 2,
            alpha: 4.0,
            targets: targets.clone(),
            seed: 1,
            dropout: 0.0,
        };
        m.enable_lora(&lora).unwrap();
        let got: Vec<String> = m
            .weights()
            .named_lora_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let mut want = Vec::new();
        for e in layout::entries(2) {
            if e.parameter.role.targeted_by(&targets) {
                let module = e.hf_name().trim_end_matches(".weight").to_string();
                want.push(format!("base_model.model.{module}.lora_A.weight"));
                want.push(format!("base_model.model.{module}.lora_B.weight"));
            }
        }
        assert_eq!(got, want, "{targets:?}");

        let mut modules = Vec::new();
        if attention {
            modules.extend(["q_proj", "k_proj", "v_proj", "o_proj"]);
        }
        if mlp {
            modules.extend(["gate_proj", "up_proj", "down_proj"]);
        }
        assert_eq!(layout::target_modules(&targets), modules);
        let dir = std::env::temp_dir().join(format!(
            "riftco-layout-{}-{attention}-{mlp}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        riftco_transformer::save_lora_adapter(&m, &dir).unwrap();
        let text = std::fs::read_to_string(dir.join("adapter_config.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["target_modules"], serde_json::json!(modules));
        let mut back = DecoderOnlyTransformer::new(config(), Attn::Flash, Ck::Disabled).unwrap();
        riftco_transformer::load_lora_adapter(&mut back, &dir).unwrap();
        let back_names: Vec<String> = back
            .weights()
            .named_lora_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(back_names, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The memory footprint that config validation checks counts exactly the table's parameters.
#[test]
fn footprint_parameter_bytes_are_the_tables_parameters() {
    for (v, d, h, l, ff) in [
        (64, 16, 2, 2, 24),
        (256, 128, 4, 4, 344),
        (1000, 96, 3, 7, 100),
    ] {
        let c = TransformerConfig::new(v, d, h, l, ff, 32);
        let elements: usize = layout::entries(l)
            .map(|e| e.shape(&c).iter().product::<usize>())
            .sum();
        let footprint = c.memory_footprint().unwrap();
        assert_eq!(footprint.parameter_bytes, 4 * elements as u128, "{c:?}");
    }
}

/// A PEFT `target_modules` that is not a whole set of target groups is refused, listing the
/// groups' modules from the table.
#[test]
fn partial_target_modules_are_refused_listing_the_groups() {
    let dir = std::env::temp_dir().join(format!("riftco-layout-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let empty: Vec<(String, safetensors::tensor::TensorView<'_>)> = Vec::new();
    std::fs::write(
        dir.join("adapter_model.safetensors"),
        safetensors::serialize(empty, None).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "k_proj"]}"#,
    )
    .unwrap();
    let mut m = DecoderOnlyTransformer::new(config(), Attn::Flash, Ck::Disabled).unwrap();
    let e = riftco_transformer::load_lora_adapter(&mut m, &dir).unwrap_err();
    assert!(
        e.to_string().ends_with(
            r#"target_modules ["q_proj", "k_proj"]: expected all of ["q_proj", "k_proj", "v_proj", "o_proj"], all of ["gate_proj", "up_proj", "down_proj"], or both"#
        ),
        "{e}"
    );
    assert!(!m.has_lora());
    std::fs::remove_dir_all(&dir).unwrap();
}
