//! A named checkpoint tensor: dtype, shape and little-endian bytes that are either memory-mapped
//! from the checkpoint file or owned (random weights, converted files). Nothing is copied until a
//! backend asks for values in the precision it computes in.

use std::sync::Arc;

use half::{bf16, f16};
use memmap2::Mmap;

/// Storage precisions a GPT-J checkpoint may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive] // more storage types may come (fp8): a match outside the crate needs a `_` arm
pub enum DType {
    /// IEEE binary32, 4 bytes.
    F32,
    /// IEEE binary16 (half), 2 bytes.
    F16,
    /// bfloat16 (f32's exponent, 8 bits of mantissa), 2 bytes.
    BF16,
}

impl DType {
    /// Bytes per element: 4 or 2.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// PyTorch's name of the type ("float32", "float16", "bfloat16"), as config.json's
    /// `torch_dtype` writes it; what messages and `Model::content_xxh3` name it by.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
        }
    }
}

#[derive(Clone)]
enum Bytes {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    },
    Owned(Arc<[u8]>),
}

/// A tensor in its storage precision. Cloning is cheap (shared bytes).
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Bytes,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {:?})", self.dtype.name(), self.shape)
    }
}

impl Tensor {
    /// A view of `len` bytes at `start` in a mapped file. The caller has checked the range.
    pub(crate) fn mapped(
        dtype: DType,
        shape: Vec<usize>,
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    ) -> Self {
        debug_assert!(start + len <= map.len());
        debug_assert_eq!(len, shape.iter().product::<usize>() * dtype.size());
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Mapped { map, start, len },
        }
    }

    /// An owned f32 tensor of `values`, row-major; panics unless `values` has exactly the
    /// product of `shape` elements.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        Tensor {
            dtype: DType::F32,
            shape,
            bytes: Bytes::Owned(bytemuck::cast_slice::<f32, u8>(values).into()),
        }
    }

    /// Stores `values` in `dtype` (rounding to nearest for the 16-bit types); panics unless
    /// `values` has exactly the product of `shape` elements, as `from_f32`.
    pub fn from_f32_as(shape: Vec<usize>, values: &[f32], dtype: DType) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        let bytes: Vec<u8> = match dtype {
            DType::F32 => bytemuck::cast_slice(values).to_vec(),
            DType::F16 => values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        };
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Owned(bytes.into()),
        }
    }

    /// The storage precision.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions, outermost first (PyTorch's order: a linear weight is [out, in]).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements: the product of `shape` (1 for a scalar's empty shape).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned(b) => b,
        }
    }

    /// The stored elements, each as its `N` little-endian bytes (`N` is `dtype().size()`).
    pub fn elements<const N: usize>(&self) -> &[[u8; N]] {
        assert_eq!(
            N,
            self.dtype.size(),
            "{self:?} has {}-byte elements",
            self.dtype.size()
        );
        bytemuck::cast_slice(self.bytes())
    }

    /// Values widened to f32 (exact for every storage type).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        self.widen_into(0, &mut out);
        out
    }

    /// Elements `start..start + out.len()` widened to f32 into `out` (exact for every storage
    /// type). Panics if the range is outside the tensor.
    pub fn widen_into(&self, start: usize, out: &mut [f32]) {
        fn widen<const N: usize>(src: &[[u8; N]], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
            for (o, &e) in out.iter_mut().zip(src) {
                *o = f(e);
            }
        }
        let range = start..start + out.len();
        match self.dtype {
            DType::F32 => widen(&self.elements()[range], out, f32::from_le_bytes),
            DType::F16 => widen(&self.elements()[range], out, f16_to_f32),
            DType::BF16 => widen(&self.elements()[range], out, bf16_to_f32),
        }
    }

    /// Values widened to f64 (exact for every storage type).
    pub fn to_f64(&self) -> Vec<f64> {
        self.to_f32().into_iter().map(f64::from).collect()
    }

    /// How many of elements `range` are NaN or infinite. Reads only the exponent bits (a value
    /// is non-finite exactly when they are all ones), in a loop the compiler vectorizes: 10-12
    /// GB/s on one core in memory, as fast as xxh3 reads (docs/architecture.md, Checkpoints).
    /// Panics if the range is outside the tensor.
    pub fn count_non_finite(&self, range: std::ops::Range<usize>) -> usize {
        // Counters as wide as the elements (so that a vector holds as many of each), summed per
        // block of fewer elements than a counter can count.
        fn count32(src: &[[u8; 4]]) -> usize {
            const MASK: u32 = 0x7f80_0000;
            src.chunks(1 << 16)
                .map(|block| {
                    block
                        .iter()
                        .map(|&e| u32::from(u32::from_le_bytes(e) & MASK == MASK))
                        .sum::<u32>() as usize
                })
                .sum()
        }
        fn count16(src: &[[u8; 2]], mask: u16) -> usize {
            src.chunks(u16::MAX as usize)
                .map(|block| {
                    block
                        .iter()
                        .map(|&e| u16::from(u16::from_le_bytes(e) & mask == mask))
                        .sum::<u16>() as usize
                })
                .sum()
        }
        match self.dtype {
            DType::F32 => count32(&self.elements()[range]),
            DType::F16 => count16(&self.elements()[range], 0x7c00),
            DType::BF16 => count16(&self.elements()[range], 0x7f80),
        }
    }

    /// The first NaN or infinite element, with its value widened to f32; None when every
    /// element is finite.
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        let mut buf = vec![0f32; self.numel().min(1 << 16)];
        let mut start = 0;
        while start < self.numel() {
            let n = buf.len().min(self.numel() - start);
            self.widen_into(start, &mut buf[..n]);
            if let Some(k) = buf[..n].iter().position(|v| !v.is_finite()) {
                return Some((start + k, buf[k]));
            }
            start += n;
        }
        None
    }
}

/// One stored float16 element (little-endian bytes) widened to f32, exactly.
pub fn f16_to_f32(e: [u8; 2]) -> f32 {
    f16::from_le_bytes(e).to_f32()
}

/// One stored bfloat16 element (little-endian bytes) widened to f32, exactly.
pub fn bf16_to_f32(e: [u8; 2]) -> f32 {
    bf16::from_le_bytes(e).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every storage type widens exactly what it stores (values representable in all three come
    /// back unchanged), whole or from an offset.
    #[test]
    fn widens_every_storage_type_whole_and_in_part() {
        let values = [1.5f32, -2.25, 0.0, 3.0e-3, -65504.0, 0.099_609_375];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = Tensor::from_f32_as(vec![2, 3], &values, dtype);
            let stored: Vec<f32> = match dtype {
                DType::F32 => values.to_vec(),
                DType::F16 => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                DType::BF16 => values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            };
            assert_eq!(t.to_f32(), stored, "{dtype:?}");
            let mut part = [0f32; 3];
            t.widen_into(2, &mut part);
            assert_eq!(part[..], stored[2..5], "{dtype:?} from offset 2");
            let wrong_size = std::panic::catch_unwind(|| match dtype {
                DType::F32 => t.elements::<2>().len(),
                _ => t.elements::<4>().len(),
            });
            assert!(wrong_size.is_err(), "{dtype:?}: elements of the wrong size");
            match dtype {
                DType::F32 => assert_eq!(t.elements::<4>().len(), 6),
                _ => assert_eq!(t.elements::<2>().len(), 6),
            }
        }
    }

    /// Every non-finite value of a long run is counted, in each storage type: 2^16 + 3
    /// infinities (a 16-bit type's blocks are summed in u16: a block of 2^16 would overflow it).
    #[test]
    fn a_long_run_of_non_finite_values_is_counted_whole() {
        let n = (1 << 16) + 3;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = Tensor::from_f32_as(vec![n], &vec![f32::INFINITY; n], dtype);
            assert_eq!(t.count_non_finite(0..n), n, "{dtype:?}");
            assert_eq!(t.count_non_finite(2..n), n - 2, "{dtype:?}");
        }
    }

    /// The first non-finite value past the first 2^16-element block is named at its own index,
    /// not at its index within the block.
    #[test]
    fn the_first_non_finite_value_past_the_first_block_is_at_its_index() {
        let n = 3 << 16;
        let mut values = vec![0.5f32; n];
        values[(1 << 16) + 5] = f32::NEG_INFINITY;
        values[(2 << 16) + 7] = f32::NAN;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = Tensor::from_f32_as(vec![n], &values, dtype);
            assert_eq!(
                t.first_non_finite(),
                Some(((1 << 16) + 5, f32::NEG_INFINITY)),
                "{dtype:?}"
            );
        }
    }

    /// The dtypes are named as PyTorch names them (config.json's torch_dtype), with their sizes.
    #[test]
    fn dtypes_have_pytorchs_names() {
        let all = [DType::F32, DType::F16, DType::BF16];
        assert_eq!(all.map(DType::name), ["float32", "float16", "bfloat16"]);
        assert_eq!(all.map(DType::size), [4, 2, 2]);
    }

    /// A scalar (an empty shape) holds one element.
    #[test]
    fn a_scalar_has_one_element() {
        let t = Tensor::from_f32(vec![], &[2.5]);
        assert_eq!(t.numel(), 1);
        assert_eq!(t.to_f32(), [2.5]);
    }

    /// The largest finite values of each storage type are finite: only an exponent of all ones
    /// is NaN or infinite.
    #[test]
    fn the_largest_finite_values_are_not_counted_as_non_finite() {
        for (dtype, max) in [
            (DType::F32, f32::MAX),
            (DType::F16, f16::MAX.to_f32()),
            (DType::BF16, bf16::MAX.to_f32()),
        ] {
            let t = Tensor::from_f32_as(vec![3], &[max, -max, 1.0], dtype);
            assert_eq!(t.to_f32(), [max, -max, 1.0], "{dtype:?}");
            assert_eq!(t.count_non_finite(0..3), 0, "{dtype:?}");
            assert_eq!(t.first_non_finite(), None, "{dtype:?}");
        }
    }
}
