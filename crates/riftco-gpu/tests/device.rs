//! Device names, the no-adapter error and the skip-or-fail rule of the GPU tests.

mod common;

use common::{gpu_or_skip, skip_or_fail};
use riftco_gpu::{list_adapters, GpuContext, GpuError, GpuKind};

#[test]
fn device_names_parse_and_unknown_names_are_errors() {
    assert_eq!("gpu".parse::<GpuKind>().unwrap(), GpuKind::Any);
    assert_eq!("vulkan".parse::<GpuKind>().unwrap(), GpuKind::Vulkan);
    assert_eq!("metal".parse::<GpuKind>().unwrap(), GpuKind::Metal);
    for kind in [GpuKind::Any, GpuKind::Vulkan, GpuKind::Metal] {
        assert_eq!(kind.name().parse::<GpuKind>().unwrap(), kind);
    }
    let e = "cuda".parse::<GpuKind>().unwrap_err();
    assert!(matches!(e, GpuError::UnknownDevice { .. }));
    assert!(e.to_string().contains("\"cuda\""), "{e}");
    let e = GpuContext::open_named("Metal").unwrap_err();
    assert!(e.to_string().contains("\"Metal\""), "{e}");
}

#[cfg(not(target_os = "macos"))]
#[test]
fn metal_off_macos_is_unavailable_and_names_what_was_found() {
    let e = GpuContext::open(GpuKind::Metal).unwrap_err();
    let GpuError::DeviceUnavailable { wanted, found, .. } = &e else {
        panic!("expected DeviceUnavailable, got {e}");
    };
    assert_eq!(wanted, "metal");
    assert_eq!(found, &list_adapters());
    let msg = e.to_string();
    assert!(msg.starts_with("no metal adapter found"), "{msg}");
    for a in found {
        assert!(msg.contains(&a.name), "{msg} lacks {}", a.name);
    }
    if found.is_empty() {
        assert!(msg.contains("no adapter on any backend"), "{msg}");
    }
}

#[test]
fn the_skip_rule_fails_under_ci_and_skips_elsewhere() {
    let missing = GpuError::DeviceUnavailable {
        wanted: "gpu".to_owned(),
        backends: "VULKAN | METAL".to_owned(),
        found: Vec::new(),
    };
    assert!(
        skip_or_fail(&missing, true).is_err(),
        "CI=true must fail, never skip"
    );
    assert_eq!(skip_or_fail(&missing, false), Ok(()));
    let unknown = GpuError::UnknownDevice {
        name: "cuda".to_owned(),
    };
    assert!(
        skip_or_fail(&unknown, false).is_err(),
        "a typo in the variable must fail"
    );
}

#[test]
fn the_opened_adapter_is_reported() {
    let Some(ctx) = gpu_or_skip("the_opened_adapter_is_reported") else {
        return;
    };
    let a = ctx.adapter();
    eprintln!("GPU tests run on: {a}");
    assert!(!a.name.is_empty());
    assert!(
        list_adapters().contains(a),
        "{a} not among {:?}",
        list_adapters()
    );
    assert_eq!(
        ctx.kind().name(),
        std::env::var(common::DEVICE_VAR).unwrap_or_else(|_| "gpu".into())
    );
}

#[test]
fn an_unavailable_gpu_is_named_as_asked() {
    use riftco_tensor::{Device, TensorError};
    let missing = || GpuError::DeviceUnavailable {
        wanted: "gpu".to_owned(),
        backends: "VULKAN | METAL".to_owned(),
        found: Vec::new(),
    };
    let e = riftco_gpu::install_error(GpuKind::Any, Device::Vulkan, missing());
    assert!(matches!(e, TensorError::GpuUnavailable { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("device gpu is unavailable: no gpu adapter found"),
        "{msg}"
    );
    assert_eq!(e.kind(), riftco_tensor::ErrorKind::DeviceUnavailable);
    let e = riftco_gpu::install_error(GpuKind::Vulkan, Device::Vulkan, missing());
    assert!(
        e.to_string().starts_with("device vulkan is unavailable"),
        "{e}"
    );
}
