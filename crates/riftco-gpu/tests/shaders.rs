//! Every shader source the crate compiles parses, validates with naga (all validation flags;
//! `Capabilities::default()`, the baseline wgpu grants a device opened with no optional
//! features, which is how `GpuContext::open` opens one) and translates to Metal Shading
//! Language 2.4 and SPIR-V 1.0. No GPU needed: this is the Metal-path check that runs
//! everywhere.
//!
//! What is checked is what the pipelines compile: for each kernel family its
//! `Family::source()`, the family's file with its libraries prepended (`shaders/philox.wgsl`
//! before `dropout.wgsl` and `flash_attention.wgsl`). A library file (`pipelines::Library`) is
//! not a shader on its own: it must validate alone as a module of only constants and functions
//! (no bindings, no entry points, so prepending it cannot clash with a family's bindings), and
//! it is translated to MSL and SPIR-V as part of every family that includes it, never alone (a
//! module without an entry point has no kernel to translate).

use std::path::PathBuf;

use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use riftco_gpu::pipelines::{Family, Library};

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

/// Parses and validates `src` (named `what` in failures).
fn validate(what: &str, src: &str) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    let info = Validator::new(ValidationFlags::all(), Capabilities::default())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    (module, info)
}

/// Every compiled source: `(name, Family::source())`, the name listing the prepended files.
fn compiled_sources() -> Vec<(String, String)> {
    Family::ALL
        .iter()
        .map(|f| {
            let mut files: Vec<&str> = f.libraries().iter().map(|l| l.file_name()).collect();
            files.push(f.file_name());
            (files.join(" + "), f.source())
        })
        .collect()
}

#[test]
fn every_shader_file_is_compiled_into_the_crate() {
    let on_disk: Vec<String> = wgsl_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut in_crate: Vec<String> = Family::ALL
        .iter()
        .map(|f| f.file_name().to_owned())
        .chain(Library::ALL.iter().map(|l| l.file_name().to_owned()))
        .collect();
    in_crate.sort();
    assert_eq!(
        on_disk, in_crate,
        "shaders/ and pipelines::{{Family, Library}} disagree"
    );
    let disk = |name: &str| std::fs::read_to_string(shader_dir().join(name)).unwrap();
    for f in Family::ALL {
        let file = disk(f.file_name());
        assert_eq!(
            file,
            f.file_source(),
            "{} embedded source is stale",
            f.file_name()
        );
        // The compiled source is the libraries, then the file.
        let mut want: String = f.libraries().iter().map(|l| disk(l.file_name())).collect();
        want.push_str(&file);
        assert_eq!(f.source(), want, "{}: compiled source", f.file_name());
    }
    for l in Library::ALL {
        assert_eq!(
            disk(l.file_name()),
            l.source(),
            "{} embedded source is stale",
            l.file_name()
        );
        assert!(
            Family::ALL.iter().any(|f| f.libraries().contains(&l)),
            "{} is prepended to no family",
            l.file_name()
        );
    }
}

#[test]
fn libraries_validate_alone_and_hold_only_constants_and_functions() {
    for l in Library::ALL {
        let (module, _) = validate(l.file_name(), l.source());
        assert!(
            module.entry_points.is_empty(),
            "{}: a library has no entry points",
            l.file_name()
        );
        assert!(
            module.global_variables.is_empty(),
            "{}: a library declares no bindings or globals",
            l.file_name()
        );
        assert!(
            !module.functions.is_empty(),
            "{}: a library defines functions",
            l.file_name()
        );
    }
    // The Philox rounds exist once: the families that use them get them from philox.wgsl.
    for f in Family::ALL {
        assert!(
            !f.file_source().contains("fn philox_round"),
            "{} defines philox_round again (it comes from philox.wgsl)",
            f.file_name()
        );
    }
}

#[test]
fn every_shader_validates_and_translates_to_msl_2_4() {
    let sources = compiled_sources();
    assert!(
        sources.len() >= 5,
        "expected the kernel families, found {}",
        sources.len()
    );
    for (what, src) in &sources {
        let (module, info) = validate(what, src);
        let options = msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        let pipeline_options = msl::PipelineOptions::default();
        let (source, _) = msl::write_string(&module, &info, &options, &pipeline_options)
            .unwrap_or_else(|e| panic!("{what} → MSL: {e}"));
        assert!(
            source.contains("kernel void"),
            "{what}: MSL output has no kernel entry point"
        );
    }
}

#[test]
fn every_shader_translates_to_spirv() {
    for (what, src) in &compiled_sources() {
        let (module, info) = validate(what, src);
        let words = spv::write_vec(&module, &info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{what} → SPIR-V: {e}"));
        assert_eq!(words.first(), Some(&0x0723_0203), "{what}: SPIR-V magic");
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
