//! Packing against the naive reference (each vector's floats, bit for bit), through a real
//! Parquet file as the fragment writer and reader use it.

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::Field;
use proptest::prelude::*;

use super::*;
use crate::format::types::vector_type;

fn vectors(dim: i32, bits: &[u32], valid: Option<Vec<bool>>) -> FixedSizeListArray {
    let values = Float32Array::from_iter_values(bits.iter().map(|b| f32::from_bits(*b)));
    let DataType::FixedSizeList(item, _) = vector_type(dim) else {
        unreachable!()
    };
    FixedSizeListArray::new(item, dim, Arc::new(values), valid.map(NullBuffer::from))
}

/// What a query sees: per row, NULL or the floats' bits.
fn rows(list: &FixedSizeListArray) -> Vec<Option<Vec<u32>>> {
    (0..list.len())
        .map(|i| {
            list.is_valid(i).then(|| {
                let v = list.value(i);
                v.as_primitive::<Float32Type>()
                    .values()
                    .iter()
                    .map(|f| f.to_bits())
                    .collect()
            })
        })
        .collect()
}

/// `packed` through a Parquet file, as the storage types' tests write and read one.
fn through_parquet(packed: &FixedSizeBinaryArray) -> FixedSizeBinaryArray {
    let array: ArrayRef = Arc::new(packed.clone());
    crate::format::storage_types::tests::through_parquet(&array)
        .unwrap()
        .as_fixed_size_binary()
        .clone()
}

proptest! {
    #[test]
    fn prop_vectors_round_trip_bit_for_bit(
        dim in 1i32..40,
        rows_and_bits in (0usize..30).prop_flat_map(|n| (
            Just(n),
            proptest::collection::vec(any::<u32>(), n * 40),
            proptest::collection::vec(any::<bool>(), n),
        )),
        with_nulls in any::<bool>(),
        from in 0usize..5,
    ) {
        let (n, bits, valid) = rows_and_bits;
        let bits = &bits[..n * dim as usize];
        let list = vectors(dim, bits, with_nulls.then_some(valid));
        let list = list.slice(from.min(n), n - from.min(n));
        let packed = pack(&list).unwrap();
        prop_assert_eq!(packed.data_type(), &packed_type(list.data_type()).unwrap());
        prop_assert_eq!(packed.len(), list.len());
        let back = unpack(&through_parquet(&packed), list.data_type()).unwrap();
        prop_assert_eq!(back.data_type(), list.data_type());
        prop_assert_eq!(rows(&back), rows(&list));
        prop_assert_eq!(rows(&unpack(&packed, list.data_type()).unwrap()), rows(&list));
    }
}

#[test]
fn packing_shares_the_buffer_and_a_misaligned_one_is_copied() {
    let list = vectors(
        2,
        &[1.0f32, -0.0, 3.5, f32::MIN_POSITIVE / 2.0].map(f32::to_bits),
        None,
    );
    let packed = pack(&list).unwrap();
    assert_eq!(
        packed.values().as_ptr(),
        list.values().to_data().buffers()[0].as_ptr()
    );
    // Three stray bytes in front: the floats sit one byte off their alignment.
    let mut bytes = vec![0u8; 3];
    bytes.extend(packed.value_data());
    let shifted = Buffer::from_vec(bytes).slice(3);
    assert_ne!(shifted.as_ptr().align_offset(4), 0);
    let misaligned = FixedSizeBinaryArray::try_new(8, shifted, None).unwrap();
    let back = unpack(&misaligned, list.data_type()).unwrap();
    assert_eq!(rows(&back), rows(&list));
}

#[test]
fn a_null_element_a_wrong_width_and_other_types_are_errors() {
    let values = Float32Array::from(vec![Some(1.0), None, Some(2.0), Some(3.0)]);
    let DataType::FixedSizeList(item, _) = vector_type(2) else {
        unreachable!()
    };
    let list = FixedSizeListArray::new(item.clone(), 2, Arc::new(values.clone()), None);
    let e = pack(&list).unwrap_err().to_string();
    assert!(e.contains("row 1") && e.contains("NULL element"), "{e}");
    // Behind a NULL vector the element is no value: packed as a NULL row.
    let list = FixedSizeListArray::new(
        item,
        2,
        Arc::new(values),
        Some(NullBuffer::from(vec![false, true])),
    );
    assert_eq!(
        rows(&unpack(&pack(&list).unwrap(), list.data_type()).unwrap()),
        rows(&list)
    );

    let wrong = FixedSizeBinaryArray::try_new(12, Buffer::from_vec(vec![0u8; 24]), None).unwrap();
    let e = unpack(&wrong, &vector_type(2)).unwrap_err().to_string();
    assert!(
        e.contains("FixedSizeBinary(8)") && e.contains("FixedSizeBinary(12)"),
        "{e}"
    );
    assert!(unpack(&wrong, &DataType::Int32).is_err());
    assert_eq!(packed_type(&DataType::Int32), None);
    assert_eq!(packed_type(&vector_type(i32::MAX)), None);
    let ints = FixedSizeListArray::new(
        Arc::new(Field::new_list_field(DataType::Int32, true)),
        1,
        Arc::new(datafusion::arrow::array::Int32Array::from(vec![1])),
        None,
    );
    assert!(pack(&ints).is_err());
}
