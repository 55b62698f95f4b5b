//! Every WGSL file of the top-level `shaders/` folder parses, validates with naga (all
//! validation flags; `Capabilities::default()`, the baseline wgpu grants a device opened with
//! no optional features, which is how `GpuContext::open` opens one) and translates to Metal Shading
//! Language 2.4 and SPIR-V 1.0. No GPU needed: this is the Metal-path check that runs
//! everywhere.

use std::path::PathBuf;

use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};

fn shader_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shaders")
}

fn wgsl_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(shader_dir())
        .expect("shaders/ exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wgsl"))
        .collect();
    files.sort();
    files
}

fn validate(path: &PathBuf) -> (naga::Module, naga::valid::ModuleInfo) {
    let src = std::fs::read_to_string(path).expect("readable shader");
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.emit_to_string(&src)));
    let info = Validator::new(ValidationFlags::all(), Capabilities::default())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.emit_to_string(&src)));
    (module, info)
}

#[test]
fn every_shader_file_is_compiled_into_the_crate() {
    let on_disk: Vec<String> = wgsl_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut in_crate: Vec<String> = riftco_gpu::pipelines::Family::ALL
        .iter()
        .map(|f| f.file_name().to_owned())
        .collect();
    in_crate.sort();
    assert_eq!(on_disk, in_crate, "shaders/ and pipelines::Family disagree");
    for f in riftco_gpu::pipelines::Family::ALL {
        let disk = std::fs::read_to_string(shader_dir().join(f.file_name())).unwrap();
        assert_eq!(
            disk,
            f.source(),
            "{} embedded source is stale",
            f.file_name()
        );
    }
}

#[test]
fn every_shader_validates_and_translates_to_msl_2_4() {
    let files = wgsl_files();
    assert!(
        files.len() >= 5,
        "expected the kernel families, found {files:?}"
    );
    for path in &files {
        let (module, info) = validate(path);
        let options = msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        let pipeline_options = msl::PipelineOptions::default();
        let (source, _) = msl::write_string(&module, &info, &options, &pipeline_options)
            .unwrap_or_else(|e| panic!("{} → MSL: {e}", path.display()));
        assert!(
            source.contains("kernel void"),
            "{}: MSL output has no kernel entry point",
            path.display()
        );
    }
}

#[test]
fn every_shader_translates_to_spirv() {
    for path in &wgsl_files() {
        let (module, info) = validate(path);
        let words = spv::write_vec(&module, &info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{} → SPIR-V: {e}", path.display()));
        assert_eq!(
            words.first(),
            Some(&0x0723_0203),
            "{}: SPIR-V magic",
            path.display()
        );
    }
}

#[test]
fn a_broken_shader_is_rejected_by_the_same_checks() {
    // The checks above can fail: an out-of-type store does not validate.
    let src = "@group(0) @binding(0) var<storage, read_write> y: array<f32>;\n\
               @compute @workgroup_size(1) fn main() { y[0] = 1u; }";
    let parsed = naga::front::wgsl::parse_str(src);
    let rejected = match parsed {
        Err(_) => true,
        Ok(module) => Validator::new(ValidationFlags::all(), Capabilities::all())
            .validate(&module)
            .is_err(),
    };
    assert!(rejected, "a u32 stored into an f32 array was accepted");
}
