//! `Backend::gather_strided` / `scatter_strided`: a view outside the tensor and a source of the
//! wrong length are errors (never a panic) on the CPU and on the mirror backend, and the
//! mirror's results are bitwise the CPU's (also after an in-place scatter).

use riftco_tensor::backend::{self, mirror, StridedView};
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

fn on(device: Device, data: Vec<f32>, dims: Vec<usize>) -> Tensor {
    let mut t = Tensor::from_vec(data, dims, C::Workspace).unwrap();
    t.transfer_to(device).unwrap();
    t
}

fn view(dims: &[usize], strides: &[isize], offset: usize) -> StridedView {
    StridedView {
        dims: dims.to_vec(),
        strides: strides.to_vec(),
        offset,
    }
}

#[test]
fn views_outside_the_tensor_and_wrong_lengths_are_errors_on_every_backend() {
    mirror::install();
    for device in [Device::Cpu, Device::PrivateUse1] {
        let be = backend::for_device(device).unwrap();
        let x = on(device, (0..6).map(|i| i as f32).collect(), vec![2, 3]);
        for v in [
            view(&[2, 3], &[3, 1], 1), // one past the end
            view(&[3], &[-1], 1),      // before the start
            view(&[2], &[1, 1], 0),    // a stride per dimension
            view(&[2, 2], &[5, 1], 0), // the second row ends past the end
        ] {
            let e = be.gather_strided("test", &x, &v, C::Workspace).unwrap_err();
            assert!(
                matches!(e, TensorError::InvalidArgument { op: "test", .. }),
                "{e}"
            );
            let src = on(
                device,
                vec![0.0; v.dims.iter().product()],
                vec![v.dims.iter().product()],
            );
            let e = be.scatter_strided("test", &x, &src, &v, false).unwrap_err();
            assert!(matches!(e, TensorError::InvalidArgument { .. }), "{e}");
        }
        let short = on(device, vec![1.0; 2], vec![2]);
        let e = be
            .scatter_strided("test", &x, &short, &view(&[3], &[1], 0), true)
            .unwrap_err();
        assert!(
            matches!(
                e,
                TensorError::LengthMismatch {
                    expected: 3,
                    got: 2,
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn mirror_results_are_bitwise_the_cpu() {
    mirror::install();
    let run = |device: Device| {
        let be = backend::for_device(device).unwrap();
        let x = on(
            device,
            (0..24).map(|i| (i as f32).sin()).collect(),
            vec![2, 3, 4],
        );
        let g = be
            .gather_strided("test", &x, &view(&[4, 2, 2], &[1, 12, -4], 8), C::Workspace)
            .unwrap();
        let v0 = x.version();
        be.scatter_strided("test", &x, &g, &view(&[4, 2, 2], &[1, 12, 4], 0), true)
            .unwrap();
        assert!(x.version() > v0, "a scatter bumps the version");
        // Source and destination sharing storage: read before written.
        be.scatter_strided(
            "test",
            &x,
            &x.reshape(vec![24]).unwrap(),
            &view(&[24], &[-1], 23),
            false,
        )
        .unwrap();
        (g.to_host().unwrap(), x.to_host().unwrap())
    };
    let (cpu, mir) = (run(Device::Cpu), run(Device::PrivateUse1));
    assert_eq!(
        cpu.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        mir.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        cpu.1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        mir.1.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
