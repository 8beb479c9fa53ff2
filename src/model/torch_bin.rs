//! placeholder until the reader lands
use crate::error::{Error, Result};
use crate::model::tensor::Tensor;
pub fn read_torch_bin(path: &std::path::Path) -> Result<Vec<(String, Tensor)>> {
    Err(Error::Checkpoint {
        path: path.to_owned(),
        msg: "pytorch_model.bin not yet supported".into(),
    })
}
