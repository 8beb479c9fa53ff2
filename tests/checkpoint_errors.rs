//! Every kind of bad checkpoint gives a clear error naming the file and the tensor, never a panic.

mod common;

use std::path::{Path, PathBuf};

use common::tiny;
use toolsift::model::checkpoint::write_safetensors;
use toolsift::model::{GptjConfig, Tensor};
use toolsift::Model;

/// A writable copy of the tiny fixture (config.json, model.safetensors, tokenizer.json).
fn copy_fixture() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny("f32").join(f), dir.join(f)).unwrap();
    }
    (tmp, dir)
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn tensors_of(dir: &Path) -> Vec<(String, Tensor)> {
    let model = Model::load(dir).unwrap();
    model.weights().named_tensors(model.config())
}

fn rewrite(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Tensor)>)) {
    let mut tensors = tensors_of(dir);
    edit(&mut tensors);
    // Write elsewhere first: the source file is memory-mapped by the tensors being written.
    let tmp = dir.join("new.safetensors");
    write_safetensors(&tmp, &tensors).unwrap();
    drop(tensors);
    std::fs::rename(tmp, dir.join("model.safetensors")).unwrap();
}

/// `dir`/model.safetensors as the 8-byte length of `header`, `header`, then `data`: a header
/// the crate's writer would never produce.
fn write_raw_safetensors(dir: &Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn assert_names(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "error {err:?} should mention {p:?}");
    }
}

#[test]
fn missing_tensor_is_named() {
    let (_tmp, dir) = copy_fixture();
    rewrite(&dir, |t| {
        t.retain(|(n, _)| n != "transformer.h.1.mlp.fc_in.bias")
    });
    let err = load_err(&dir);
    assert_names(
        &err,
        &["transformer.h.1.mlp.fc_in.bias", "missing", "model"],
    );
}

#[test]
fn unexpected_tensor_is_named() {
    let (_tmp, dir) = copy_fixture();
    rewrite(&dir, |t| {
        t.push((
            "transformer.h.7.attn.q_proj.weight".into(),
            Tensor::from_f32(vec![2], &[1.0, 2.0]),
        ))
    });
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            "transformer.h.7.attn.q_proj.weight",
            "unexpected",
            "model.safetensors",
        ],
    );
}

#[test]
fn ignored_buffers_are_skipped() {
    let (_tmp, dir) = copy_fixture();
    rewrite(&dir, |t| {
        t.push((
            "transformer.h.0.attn.masked_bias".into(),
            Tensor::from_f32(vec![1], &[-1e9]),
        ))
    });
    Model::load(&dir).unwrap();
}

#[test]
fn wrong_shape_is_named() {
    let (_tmp, dir) = copy_fixture();
    rewrite(&dir, |t| {
        let (_, w) = t.iter_mut().find(|(n, _)| n == "lm_head.bias").unwrap();
        *w = Tensor::from_f32(vec![500], &vec![0.5; 500]);
    });
    let err = load_err(&dir);
    assert_names(
        &err,
        &["lm_head.bias", "[500]", "[512]", "model.safetensors"],
    );
}

#[test]
fn unsupported_dtype_is_named() {
    let (_tmp, dir) = copy_fixture();
    let mut tensors = tensors_of(&dir);
    tensors.retain(|(n, _)| n != "transformer.ln_f.bias");
    let ints = vec![0u8; 64 * 8];
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, t)| {
            let dt = match t.dtype() {
                toolsift::model::DType::F32 => safetensors::Dtype::F32,
                _ => unreachable!(),
            };
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dt, t.shape().to_vec(), t.bytes()).unwrap(),
            )
        })
        .collect();
    views.push((
        "transformer.ln_f.bias".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![64], &ints).unwrap(),
    ));
    let tmp = dir.join("new.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &tmp).unwrap();
    drop(tensors);
    std::fs::rename(tmp, dir.join("model.safetensors")).unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["transformer.ln_f.bias", "I64", "model.safetensors"]);
}

#[test]
fn truncated_file_is_reported() {
    let (_tmp, dir) = copy_fixture();
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["model.safetensors", "truncated or corrupt"]);
}

#[test]
fn corrupt_file_is_reported() {
    let (_tmp, dir) = copy_fixture();
    std::fs::write(
        dir.join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage",
    )
    .unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["model.safetensors", "header claims", "corrupt"]);

    let mut garbage = 7u64.to_le_bytes().to_vec();
    garbage.extend_from_slice(b"garbage");
    std::fs::write(dir.join("model.safetensors"), garbage).unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["model.safetensors", "not a valid safetensors file"]);
}

/// A header that names a tensor twice is refused (the crate would load the last of the two).
#[test]
fn a_tensor_named_twice_is_reported() {
    let (_tmp, dir) = copy_fixture();
    let entry = r#""odd.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
    let header = format!("{{{entry},{entry}}}");
    write_raw_safetensors(&dir, &header, &1.0f32.to_le_bytes());
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            "model.safetensors",
            "odd.weight",
            "appears twice in the header",
        ],
    );
}

/// A header that declares more dimensions than any tensor has is refused with the tensor's name
/// (the crate itself accepts it: 65 dims of 1 hold the one float the file has).
#[test]
fn too_many_dimensions_are_reported() {
    let (_tmp, dir) = copy_fixture();
    let shape = vec!["1"; 65].join(",");
    let header =
        format!(r#"{{"odd.weight":{{"dtype":"F32","shape":[{shape}],"data_offsets":[0,4]}}}}"#);
    write_raw_safetensors(&dir, &header, &1.0f32.to_le_bytes());
    let err = load_err(&dir);
    assert_names(
        &err,
        &["odd.weight", "more than 64 dimensions", "model.safetensors"],
    );
}

/// Offsets past the end of the data are refused with the tensor's name. The crate (0.8) checks
/// that offsets tile and match the shapes, then sums the last one unchecked: eight legal
/// 2^61-1-byte tensors in a chain overflowed that sum, a panic in debug and test builds.
#[test]
fn offsets_past_the_data_are_reported_not_summed() {
    let (_tmp, dir) = copy_fixture();
    let size: u64 = (1 << 61) - 1;
    let entries: Vec<String> = (0..8u64)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"U8","shape":[{size}],"data_offsets":[{},{}]}}"#,
                i * size,
                (i + 1) * size
            )
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    write_raw_safetensors(&dir, &header, &[]);
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            "model.safetensors",
            "t0",
            &format!("data_offsets holds {size}, past the end of the data (0 bytes)"),
        ],
    );
}

#[test]
fn weights_that_are_a_folder_are_named() {
    let (_tmp, dir) = copy_fixture();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::create_dir(dir.join("model.safetensors")).unwrap();
    let err = load_err(&dir);
    assert_names(
        &err,
        &["model.safetensors", "exists but is not a regular file"],
    );
}

/// Weights behind a symbolic link to nothing are named so, not "no weights found".
#[cfg(unix)]
#[test]
fn weights_that_are_a_dangling_link_are_named() {
    let (_tmp, dir) = copy_fixture();
    let weights = dir.join("model.safetensors");
    std::fs::remove_file(&weights).unwrap();
    std::os::unix::fs::symlink(dir.join("gone.safetensors"), &weights).unwrap();
    let err = load_err(&dir);
    assert_names(
        &err,
        &["model.safetensors", "is a symbolic link to nothing"],
    );
}

#[test]
fn no_weights_at_all_is_reported() {
    let (_tmp, dir) = copy_fixture();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let err = load_err(&dir);
    assert_names(
        &err,
        &["no weights found", "model.safetensors", "pytorch_model.bin"],
    );
}

#[test]
fn rotary_dim_larger_than_head_dim_is_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["rotary_dim"] = 32.into());
    let err = load_err(&dir);
    assert_names(
        &err,
        &["config.json", "rotary_dim (32)", "head dimension (16"],
    );
}

#[test]
fn odd_rotary_dim_is_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["rotary_dim"] = 7.into());
    assert_names(&load_err(&dir), &["config.json", "rotary_dim (7)", "even"]);
}

#[test]
fn n_embd_not_divisible_by_n_head_is_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["n_head"] = 5.into());
    let err = load_err(&dir);
    assert_names(
        &err,
        &["config.json", "n_embd (64) is not divisible by n_head (5)"],
    );
}

#[test]
fn malformed_config_is_reported() {
    let (_tmp, dir) = copy_fixture();
    std::fs::write(dir.join("config.json"), "{\"n_embd\": 64,").unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["config.json", "not a GPT-J config"]);
}

#[test]
fn config_describing_another_model_is_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["n_layer"] = 3.into());
    let err = load_err(&dir);
    assert_names(&err, &["transformer.h.2", "missing"]);
    let (_tmp2, dir) = copy_fixture();
    edit_config(&dir, |v| v["n_embd"] = 32.into());
    let err = load_err(&dir);
    assert_names(
        &err,
        &["transformer.wte.weight", "shape", "model.safetensors"],
    );
}

#[test]
fn absurd_n_layer_is_a_missing_tensor_not_an_allocation() {
    let (_tmp, dir) = copy_fixture();
    // Listing 13 names per layer up front would need terabytes.
    edit_config(&dir, |v| v["n_layer"] = (1u64 << 40).into());
    let err = load_err(&dir);
    assert_names(&err, &["transformer.h.2.ln_1.weight", "missing"]);
}

#[test]
fn n_positions_beyond_the_limit_is_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["n_positions"] = (1u64 << 40).into());
    let err = load_err(&dir);
    assert_names(&err, &["config.json", "n_positions (1099511627776)"]);
}

#[test]
fn convert_refuses_to_overwrite_its_source() {
    let (_tmp, dir) = copy_fixture();
    let before = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let model = Model::load(&dir).unwrap();
    // The same folder under another spelling is still the same folder.
    let err = toolsift::model::checkpoint::convert(&model, &dir.join("."), None)
        .unwrap_err()
        .to_string();
    assert_names(&err, &["is the folder being converted"]);
    assert_eq!(std::fs::read(dir.join("tokenizer.json")).unwrap(), before);
    // A file where the folder should be.
    let err = toolsift::model::checkpoint::convert(&model, &dir.join("config.json"), None)
        .unwrap_err()
        .to_string();
    assert_names(&err, &["config.json", "is not a folder"]);
    Model::load(&dir).unwrap();
    // A folder holding a sharded checkpoint would hold two checkpoints.
    let out = dir.parent().unwrap().join("sharded");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("model.safetensors.index.json"), "{}").unwrap();
    let err = toolsift::model::checkpoint::convert(&model, &out, None)
        .unwrap_err()
        .to_string();
    assert_names(&err, &["sharded", "model.safetensors.index.json"]);
}

#[test]
fn sharded_safetensors_load_and_a_missing_shard_is_named() {
    let (_tmp, dir) = copy_fixture();
    let tensors = tensors_of(&dir);
    let (a, b) = tensors.split_at(tensors.len() / 2);
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), a).unwrap();
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), b).unwrap();
    let mut map = serde_json::Map::new();
    for (n, _) in a {
        map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
    }
    for (n, _) in b {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    // Beside model.safetensors, the index is not read (transformers' order): not even a shard
    // it lists that is not there.
    let index = dir.join("model.safetensors.index.json");
    let good = std::fs::read_to_string(&index).unwrap();
    let mut missing = map.clone();
    missing.insert(a[0].0.clone(), "model-00003-of-00002.safetensors".into());
    std::fs::write(
        &index,
        serde_json::json!({"weight_map": missing}).to_string(),
    )
    .unwrap();
    Model::load(&dir).unwrap();
    std::fs::write(&index, &good).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let sharded = Model::load(&dir).unwrap();
    let whole = Model::load(tiny("f32")).unwrap();
    assert_eq!(
        sharded.weights().lm_head.weight.to_f32(),
        whole.weights().lm_head.weight.to_f32()
    );
    // An index that does not describe its shards: a tensor listed in the wrong shard, a
    // tensor listed that no shard holds.
    let first = a[0].0.clone();
    drop(tensors);
    let mut wrong = map.clone();
    wrong.insert(first.clone(), "model-00002-of-00002.safetensors".into());
    std::fs::write(&index, serde_json::json!({"weight_map": wrong}).to_string()).unwrap();
    assert_names(
        &load_err(&dir),
        &["model.safetensors.index.json", &first, "is in"],
    );
    let mut extra = map.clone();
    extra.insert(
        "transformer.h.99.attn.q_proj.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    std::fs::write(&index, serde_json::json!({"weight_map": extra}).to_string()).unwrap();
    assert_names(
        &load_err(&dir),
        &["transformer.h.99.attn.q_proj.weight", "lacks it"],
    );
    // A tensor a shard holds that the index leaves out: transformers would not load it, so
    // neither does toolsift (and the model is not loaded without it either).
    let mut short = map.clone();
    short.remove(&first);
    std::fs::write(&index, serde_json::json!({"weight_map": short}).to_string()).unwrap();
    assert_names(
        &load_err(&dir),
        &[
            &first,
            "model-00001-of-00002.safetensors",
            "not in the index's weight_map",
        ],
    );
    // Old GPT-J indexes list the attention buffers, which the loader skips: listed, they are
    // no inconsistency.
    let mut buffers = map.clone();
    buffers.insert(
        "transformer.h.0.attn.bias".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    std::fs::write(
        &index,
        serde_json::json!({"weight_map": buffers}).to_string(),
    )
    .unwrap();
    Model::load(&dir).unwrap();
    std::fs::write(&index, good).unwrap();
    Model::load(&dir).unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_err(&dir);
    // The missing shard is named with the first tensor (in name order) listed in it.
    let first_in_2 = map
        .iter()
        .filter(|(_, shard)| *shard == "model-00002-of-00002.safetensors")
        .map(|(name, _)| name.as_str())
        .min()
        .unwrap();
    assert_names(
        &err,
        &[
            "model-00002-of-00002.safetensors",
            &format!("`{first_in_2}`"),
        ],
    );
}

/// convert never writes through a link into the source, removes a stale tokenizer.json, and a
/// conversion that fails leaves the earlier output as it was.
#[cfg(unix)]
#[test]
fn convert_leaves_sources_and_earlier_outputs_whole() {
    let (tmp, dir) = copy_fixture();
    let model = Model::load(&dir).unwrap();
    let tokenizer = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let config = std::fs::read(dir.join("config.json")).unwrap();
    // A destination that is a hard link or a symlink to a source file.
    let hard = |a: &Path, b: &Path| std::fs::hard_link(a, b);
    let soft = |a: &Path, b: &Path| std::os::unix::fs::symlink(a, b);
    type Link<'a> = &'a dyn Fn(&Path, &Path) -> std::io::Result<()>;
    let links: [Link; 2] = [&hard, &soft];
    for (k, link) in links.into_iter().enumerate() {
        let out = tmp.path().join(format!("linked{k}"));
        std::fs::create_dir(&out).unwrap();
        link(&dir.join("tokenizer.json"), &out.join("tokenizer.json")).unwrap();
        let err = toolsift::model::checkpoint::convert(&model, &out, None)
            .unwrap_err()
            .to_string();
        assert_names(&err, &["tokenizer.json is the source's"]);
        assert_eq!(
            std::fs::read(dir.join("tokenizer.json")).unwrap(),
            tokenizer
        );
        assert_eq!(std::fs::read(dir.join("config.json")).unwrap(), config);
    }
    // A file of the source folder that the model keeps no handle on (config.json) too.
    let out = tmp.path().join("linked_config");
    std::fs::create_dir(&out).unwrap();
    std::fs::hard_link(dir.join("config.json"), out.join("config.json")).unwrap();
    let err = toolsift::model::checkpoint::convert(&model, &out, None)
        .unwrap_err()
        .to_string();
    assert_names(&err, &["config.json is the source's"]);
    assert_eq!(std::fs::read(dir.join("config.json")).unwrap(), config);
    // A conversion that fails midway (its weights are written, its tokenizer.json cannot be)
    // leaves the earlier output: no new file, no temporary file.
    let out = tmp.path().join("out");
    toolsift::model::checkpoint::convert(&model, &out, None).unwrap();
    let files = ["config.json", "model.safetensors", "tokenizer.json"];
    let read_all = || -> Vec<_> {
        files
            .iter()
            .map(|f| std::fs::read(out.join(f)).unwrap())
            .collect()
    };
    let before = read_all();
    std::fs::create_dir(out.join("tokenizer.json.tmp")).unwrap();
    toolsift::model::checkpoint::convert(&model, &out, Some(toolsift::model::DType::BF16))
        .unwrap_err();
    std::fs::remove_dir(out.join("tokenizer.json.tmp")).unwrap();
    assert!(before == read_all(), "the earlier output changed");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 3);
    // A destination name that is a folder is refused before anything is written (the weights
    // were renamed into place, then config.json's rename failed).
    for name in files {
        let other = tmp.path().join(format!("folder-{name}"));
        std::fs::create_dir_all(other.join(name).join("sub")).unwrap();
        let err = toolsift::model::checkpoint::convert(&model, &other, None)
            .unwrap_err()
            .to_string();
        assert_names(&err, &[&format!("{name} is a folder there")]);
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1, "{name}");
    }
    // A dangling symlink as the output folder is named as such.
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
    let err = toolsift::model::checkpoint::convert(&model, &dangling, None)
        .unwrap_err()
        .to_string();
    assert_names(&err, &["dangling", "symbolic link to nothing"]);
    // Another conversion into the folder (it holds config.json's temporary file locked) is
    // refused before anything is written, and its temporary weights are left to it.
    let lock = std::fs::File::create(out.join("config.json.tmp")).unwrap();
    lock.lock().unwrap();
    std::fs::write(out.join("model.safetensors.tmp"), b"theirs").unwrap();
    let err =
        toolsift::model::checkpoint::convert(&model, &out, Some(toolsift::model::DType::BF16))
            .unwrap_err()
            .to_string();
    assert_names(
        &err,
        &["another toolsift process is writing", "config.json"],
    );
    assert_eq!(
        std::fs::read(out.join("model.safetensors.tmp")).unwrap(),
        b"theirs"
    );
    assert!(before == read_all(), "the earlier output changed");
    // Once that writer is gone (killed: its temporary files stay, unlocked), a conversion
    // reuses them, and leaves no other file behind.
    drop(lock);
    toolsift::model::checkpoint::convert(&model, &out, None).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, files);
    assert!(
        before == read_all(),
        "the same model converts to the same bytes"
    );
    // A source without a tokenizer: the earlier output's tokenizer.json is not kept beside
    // weights it does not belong to.
    let bare = Model::from_parts(model.config().clone(), model.weights().clone(), None).unwrap();
    toolsift::model::checkpoint::convert(&bare, &out, None).unwrap();
    assert!(!out.join("tokenizer.json").exists());
    Model::load(&out).unwrap();
}

/// Sizes whose parameter count overflows are a config error, not an overflow.
#[test]
fn sizes_that_overflow_are_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| {
        v["n_embd"] = (1u64 << 62).into();
        v["n_head"] = 1.into();
        v["rotary_dim"] = 2.into();
    });
    assert_names(&load_err(&dir), &["config.json", "overflows"]);
}

#[test]
fn bfloat16_checkpoint_loads() {
    let (_tmp, dir) = copy_fixture();
    let model = Model::load(&dir).unwrap();
    let out = dir.join("bf16");
    toolsift::model::checkpoint::convert(&model, &out, Some(toolsift::model::DType::BF16)).unwrap();
    let bf = Model::load(&out).unwrap();
    assert_eq!(bf.weights().wte.dtype(), toolsift::model::DType::BF16);
    let cfg: GptjConfig = bf.config().clone();
    assert_eq!(&cfg, model.config());
}

#[test]
fn convert_turns_pytorch_bin_into_equal_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("converted");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_toolsift"))
        .args(["convert", "--model"])
        .arg(tiny("bin"))
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(out.join("tokenizer.json").is_file());
    // config.json keeps the fields the engine does not read (token ids, architectures).
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["bos_token_id"], 499);
    assert_eq!(cfg["architectures"][0], "GPTJForCausalLM");
    let converted = Model::load(&out).unwrap();
    let original = Model::load(tiny("f32")).unwrap();
    let a = converted.weights().named_tensors(converted.config());
    let b = original.weights().named_tensors(original.config());
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(
            ta.dtype(),
            toolsift::model::DType::F16,
            "{na} keeps its dtype"
        );
        assert_eq!(ta.to_f32(), tb.to_f32(), "{na}");
    }
}

#[test]
fn truncated_pytorch_bin_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(tiny("bin").join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(tiny("bin").join("pytorch_model.bin")).unwrap();
    std::fs::write(dir.join("pytorch_model.bin"), &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["pytorch_model.bin"]);
}

#[test]
fn flipped_byte_in_pytorch_bin_weights_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(tiny("bin").join("config.json"), dir.join("config.json")).unwrap();
    let mut bytes = std::fs::read(tiny("bin").join("pytorch_model.bin")).unwrap();
    // One flipped bit in the middle of every storage (some are buffers the loader skips).
    let starts: Vec<(u64, u64)> = {
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
        let mut starts = Vec::new();
        for i in 0..zip.len() {
            let f = zip.by_index_raw(i).unwrap();
            if f.name().unwrap().contains("/data/") && f.compressed_size() > 0 {
                starts.push((f.data_start().unwrap(), f.compressed_size()));
            }
        }
        starts
    };
    assert!(starts.len() > 20);
    for (start, size) in starts {
        bytes[(start + size / 2) as usize] ^= 0x10;
    }
    std::fs::write(dir.join("pytorch_model.bin"), &bytes).unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["pytorch_model.bin", "is corrupt", "CRC-32"]);
}

/// A NaN or an infinity in a weight is refused at load, naming the tensor, the file, how many
/// values and where the first is (generate would write garbage, score a loss that is not finite).
#[test]
fn non_finite_weights_are_named() {
    for dtype in [
        toolsift::model::DType::F32,
        toolsift::model::DType::F16,
        toolsift::model::DType::BF16,
    ] {
        // A NaN in fc_in.weight (when `nan`), +inf and -inf in lm_head.bias.
        let corrupt = |nan: bool| {
            let (tmp, dir) = copy_fixture();
            rewrite(&dir, |t| {
                for (name, w) in t.iter_mut() {
                    let mut v = w.to_f32();
                    if name == "transformer.h.0.mlp.fc_in.weight" && nan {
                        v[1234] = f32::NAN;
                    }
                    if name == "lm_head.bias" {
                        v[7] = f32::INFINITY;
                        v[9] = f32::NEG_INFINITY;
                    }
                    *w = Tensor::from_f32_as(w.shape().to_vec(), &v, dtype);
                }
            });
            (tmp, dir)
        };
        let (_tmp, dir) = corrupt(true);
        let err = load_err(&dir);
        assert_names(
            &err,
            &[
                "model.safetensors",
                "transformer.h.0.mlp.fc_in.weight",
                "1 non-finite value (NaN at element 1234)",
                "1 more tensor",
            ],
        );
        // The other one alone: the count and the first, with its sign.
        let (_tmp, dir) = corrupt(false);
        let err = load_err(&dir);
        assert_names(
            &err,
            &[
                "model.safetensors",
                "lm_head.bias",
                "2 non-finite values (first: +inf at element 7)",
            ],
        );
        assert!(!err.contains("more tensor"), "{err}");
    }
}

/// The same check on a pytorch_model.bin (float16), whose bytes are read through another path.
#[test]
fn non_finite_weights_in_a_pytorch_bin_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(tiny("bin").join("config.json"), dir.join("config.json")).unwrap();
    let model = Model::load(tiny("bin")).unwrap();
    // A float16 NaN written over the first element of ln_f.weight's storage: find its bytes.
    let t = &model.weights().ln_f.weight;
    let needle = &t.bytes()[..16];
    let mut bytes = std::fs::read(tiny("bin").join("pytorch_model.bin")).unwrap();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("ln_f.weight's bytes in the file");
    bytes[at..at + 2].copy_from_slice(&[0x00, 0x7e]);
    // Keep the zip's CRC-32 right, so that only the value is wrong.
    let crc_fix = {
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
        let mut fix = None;
        for i in 0..zip.len() {
            let f = zip.by_index_raw(i).unwrap();
            let (start, size) = (
                f.data_start().unwrap() as usize,
                f.compressed_size() as usize,
            );
            if (start..start + size).contains(&at) {
                fix = Some((f.crc32(), crc32fast::hash(&bytes[start..start + size])));
            }
        }
        fix.unwrap()
    };
    let (old, new) = (crc_fix.0.to_le_bytes(), crc_fix.1.to_le_bytes());
    let mut k = 0;
    while let Some(p) = bytes[k..].windows(4).position(|w| w == old) {
        bytes[k + p..k + p + 4].copy_from_slice(&new);
        k += p + 4;
    }
    std::fs::write(dir.join("pytorch_model.bin"), &bytes).unwrap();
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            "pytorch_model.bin",
            "transformer.ln_f.weight",
            "1 non-finite value (NaN at element 0)",
        ],
    );
}

/// A shard named "." or "" (or anything but a plain file name) in the index, or one that is
/// missing or a folder, is reported naming the index and the tensor, not as an OS error; one
/// that is another file of the folder is named as read for the index.
#[test]
fn bad_shard_names_in_the_index_are_named() {
    let (_tmp, dir) = copy_fixture();
    let tensors = tensors_of(&dir);
    let first = tensors[0].0.clone();
    std::fs::rename(
        dir.join("model.safetensors"),
        dir.join("model-00001-of-00001.safetensors"),
    )
    .unwrap();
    let index = dir.join("model.safetensors.index.json");
    let write_index = |first_shard: &str| {
        let mut map = serde_json::Map::new();
        for (n, _) in &tensors {
            map.insert(n.clone(), "model-00001-of-00001.safetensors".into());
        }
        map.insert(first.clone(), first_shard.into());
        std::fs::write(&index, serde_json::json!({"weight_map": map}).to_string()).unwrap();
    };
    // A NUL (the fuzz test's find) was an OS error naming only the shard.
    for bad in [
        ".",
        "",
        "..",
        "sub/x.safetensors",
        "sub\\x.safetensors",
        "a\0b",
        // A trailing separator: the path's one component is a plain name, the string is not.
        "model-00001-of-00001.safetensors/",
    ] {
        write_index(bad);
        let err = load_err(&dir);
        assert_names(
            &err,
            &[
                "model.safetensors.index.json",
                &first,
                &format!("{bad:?}"),
                "plain file name",
            ],
        );
    }
    write_index("model-00002-of-00002.safetensors");
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            "model.safetensors.index.json",
            &first,
            "model-00002-of-00002.safetensors",
            "does not exist",
        ],
    );
    std::fs::create_dir(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            "model.safetensors.index.json",
            &first,
            "model-00002-of-00002.safetensors",
            "not a regular file",
        ],
    );
    // A file of the folder that is not a shard: the error says the index made it one.
    for not_a_shard in [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
    ] {
        write_index(not_a_shard);
        let err = load_err(&dir);
        assert_names(
            &err,
            &[
                not_a_shard,
                "not a safetensors file",
                "read as a shard that model.safetensors.index.json names",
            ],
        );
    }
    write_index("model-00001-of-00001.safetensors");
    drop(tensors);
    Model::load(&dir).unwrap();
}

/// A tokenizer.json that is a folder is not "no tokenizer.json".
#[test]
fn tokenizer_json_that_is_a_folder_is_reported() {
    let (_tmp, dir) = copy_fixture();
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    std::fs::create_dir(dir.join("tokenizer.json")).unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["tokenizer.json", "not a file"]);
    std::fs::remove_dir(dir.join("tokenizer.json")).unwrap();
    let model = Model::load(&dir).unwrap();
    assert!(model.tokenizer_if_any().is_none());
    // Asked for, the missing file is the model's problem, not the request's.
    match model.tokenizer() {
        Err(e @ toolsift::Error::Tokenizer { .. }) => {
            assert!(!e.is_input());
            assert_names(
                &e.to_string(),
                &["tokenizer.json", "not in the model folder"],
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A tokenizer.json that is JSON but no tokenizer (a config.json copied over it) is reported as
/// that, with the tokenizers crate's reason, not as a JSON syntax error; one that is no JSON
/// says so.
#[test]
fn tokenizer_json_that_is_not_a_tokenizer_is_reported_as_such() {
    let (_tmp, dir) = copy_fixture();
    let path = dir.join("tokenizer.json");
    std::fs::copy(dir.join("config.json"), &path).unwrap();
    let err = load_err(&dir);
    assert_names(
        &err,
        &[
            &path.display().to_string(),
            "is JSON, but not a Hugging Face tokenizer",
            " column ",
        ],
    );
    std::fs::write(&path, "{\"model\": ").unwrap();
    let err = load_err(&dir);
    assert_names(&err, &["tokenizer.json", "is not valid JSON", "EOF"]);
}

/// `convert --dtype f16` refuses a weight past f16's range (it would be written as infinity,
/// a checkpoint the loader refuses) and names it; what it writes loads in transformers too: the
/// safetensors header says `"format": "pt"` and config.json has a model_type.
#[test]
fn convert_refuses_what_f16_cannot_hold_and_writes_what_transformers_reads() {
    let (tmp, dir) = copy_fixture();
    edit_config(&dir, |c| {
        c.as_object_mut().unwrap().remove("model_type");
        // transformers 4.56+'s name for torch_dtype.
        c["dtype"] = "float32".into();
    });
    let out = tmp.path().join("f16");
    let model = Model::load(&dir).unwrap();
    toolsift::model::checkpoint::convert(&model, &out, Some(toolsift::model::DType::F16)).unwrap();
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert_eq!(header["__metadata__"]["format"], "pt", "{header}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "gptj");
    assert_eq!(
        (&cfg["torch_dtype"], &cfg["dtype"]),
        (&"float16".into(), &"float16".into())
    );
    drop(model);

    rewrite(&dir, |tensors| {
        let (_, w) = tensors
            .iter_mut()
            .find(|(n, _)| n == "transformer.h.0.mlp.fc_in.weight")
            .unwrap();
        let mut values = w.to_f32();
        values[3] = 70000.0;
        *w = Tensor::from_f32(w.shape().to_vec(), &values);
    });
    let model = Model::load(&dir).unwrap();
    let out = tmp.path().join("f16-again");
    let err = toolsift::model::checkpoint::convert(&model, &out, Some(toolsift::model::DType::F16))
        .unwrap_err()
        .to_string();
    assert_names(
        &err,
        &[
            "transformer.h.0.mlp.fc_in.weight",
            "70000",
            "element 3",
            "bf16",
        ],
    );
    assert!(!out.join("model.safetensors").exists());
    // bf16 holds it.
    toolsift::model::checkpoint::convert(&model, &out, Some(toolsift::model::DType::BF16)).unwrap();
}

/// config.json must be one object with each key once (serde alone reads an array of the
/// fields in order, and keeps the last of two keys); a byte order mark before it is skipped.
#[test]
fn config_json_is_read_strictly() {
    let (_tmp, dir) = copy_fixture();
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("\u{feff}{text}")).unwrap();
    let model = Model::load(&dir).unwrap();
    toolsift::model::checkpoint::convert(&model, &dir.join("converted"), None).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let fields: Vec<serde_json::Value> = v.as_object().unwrap().values().cloned().collect();
    std::fs::write(&path, serde_json::Value::Array(fields).to_string()).unwrap();
    assert_names(
        &load_err(&dir),
        &["config.json", "not a JSON object (it is an array)"],
    );
    v["n_layer"] = 1.into();
    let twice = v
        .to_string()
        .replacen('{', &format!("{{\"n_layer\":{},", text.len()), 1);
    std::fs::write(&path, twice).unwrap();
    assert_names(
        &load_err(&dir),
        &["config.json", "duplicate key \"n_layer\""],
    );
}

/// A config.json that is a pipe is an error, not a read that never ends.
#[cfg(unix)]
#[test]
fn config_json_that_is_a_pipe_is_reported() {
    let (_tmp, dir) = copy_fixture();
    let config = dir.join("config.json");
    std::fs::remove_file(&config).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&config).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfifo is not available");
        return;
    }
    let err = load_err(&dir);
    assert_names(&err, &["config.json", "not a regular file"]);
}

/// A tokenizer.json that makes the tokenizers crate panic (an `expect` in its deserializers: a
/// syntax error inside "decoder", a "Precompiled" normalizer whose charsmap is not a string) is
/// an error naming the file, not a crash (found by tests/checkpoint_fuzz.rs).
#[test]
fn tokenizer_json_that_panics_the_tokenizers_crate_is_an_error() {
    let (_tmp, dir) = copy_fixture();
    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap();
    // A vertical tab is not JSON whitespace.
    let broken = text.replacen("\"decoder\": {", "\"decoder\": {\u{b}", 1);
    assert_ne!(broken, text);
    std::fs::write(&path, broken).unwrap();
    assert_names(
        &load_err(&dir),
        &["tokenizer.json", "is not valid JSON", " column "],
    );
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["normalizer"] = serde_json::json!({"type": "Precompiled", "precompiled_charsmap": 5});
    std::fs::write(&path, v.to_string()).unwrap();
    assert_names(
        &load_err(&dir),
        &[
            "tokenizer.json",
            "not a Hugging Face tokenizer",
            "the tokenizers crate failed on it",
        ],
    );
}

/// A UTF-8 byte order mark before tokenizer.json or model.safetensors.index.json is skipped, as
/// before config.json (both were "not valid JSON: expected value at line 1 column 1").
#[test]
fn byte_order_marks_are_skipped_in_every_json_file() {
    let (_tmp, dir) = copy_fixture();
    for name in ["config.json", "tokenizer.json"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        std::fs::write(dir.join(name), format!("\u{feff}{text}")).unwrap();
    }
    let names: Vec<String> = tensors_of(&dir).into_iter().map(|(n, _)| n).collect();
    std::fs::rename(
        dir.join("model.safetensors"),
        dir.join("model-00001-of-00001.safetensors"),
    )
    .unwrap();
    let map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| (n.clone(), "model-00001-of-00001.safetensors".into()))
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map}).to_string();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        format!("\u{feff}{index}"),
    )
    .unwrap();
    let model = Model::load(&dir).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    assert!(!tokenizer.encode("Hello world").unwrap().ids.is_empty());
    // Only one: a second is a character before the JSON.
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        format!("\u{feff}\u{feff}{index}"),
    )
    .unwrap();
    assert_names(
        &load_err(&dir),
        &["model.safetensors.index.json", "not valid JSON"],
    );
}

/// A tensor named twice in the index's weight_map is an error naming it and the index (serde
/// keeps the last silently: which shard holds it?), whether or not the two shards agree.
#[test]
fn a_tensor_listed_twice_in_the_index_is_named() {
    let (_tmp, dir) = copy_fixture();
    let names: Vec<String> = tensors_of(&dir).into_iter().map(|(n, _)| n).collect();
    let shard = "model-00001-of-00001.safetensors";
    std::fs::rename(dir.join("model.safetensors"), dir.join(shard)).unwrap();
    let map: serde_json::Map<String, serde_json::Value> =
        names.iter().map(|n| (n.clone(), shard.into())).collect();
    let index = serde_json::json!({"weight_map": map}).to_string();
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, &index).unwrap();
    Model::load(&dir).unwrap();
    let twice = &names[3];
    for other in ["model-00002-of-00002.safetensors", shard] {
        let text = index.replacen(
            "\"weight_map\":{",
            &format!("\"weight_map\":{{\"{twice}\":\"{other}\","),
            1,
        );
        assert_ne!(text, index);
        std::fs::write(&path, text).unwrap();
        assert_names(
            &load_err(&dir),
            &["model.safetensors.index.json", twice, "listed twice"],
        );
    }
    // weight_map itself twice, and not an object at all.
    let text = index.replacen("{", "{\"weight_map\":{},", 1);
    std::fs::write(&path, text).unwrap();
    assert_names(
        &load_err(&dir),
        &[
            "model.safetensors.index.json",
            "\"weight_map\" appears twice",
        ],
    );
    std::fs::write(&path, "[{\"weight_map\": {}}]").unwrap();
    assert_names(
        &load_err(&dir),
        &["model.safetensors.index.json", "invalid type: sequence"],
    );
    std::fs::write(&path, "{\"weight_map\": null}").unwrap();
    assert_names(
        &load_err(&dir),
        &["model.safetensors.index.json", "no \"weight_map\" object"],
    );
}

/// A tensor that two shards both hold is refused naming both, also where the index lists it in
/// the shard read last (which would otherwise replace the first shard's copy unseen).
#[test]
fn a_tensor_two_shards_hold_is_named() {
    let (_tmp, dir) = copy_fixture();
    let tensors = tensors_of(&dir);
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let twice = a[0].0.clone();
    let mut b = b.to_vec();
    b.push(a[0].clone());
    write_safetensors(&dir.join(shards[0]), a).unwrap();
    write_safetensors(&dir.join(shards[1]), &b).unwrap();
    // The index lists the tensor in the second shard, which is read last.
    let mut map = serde_json::Map::new();
    for (n, _) in a {
        map.insert(n.clone(), shards[0].into());
    }
    for (n, _) in &b {
        map.insert(n.clone(), shards[1].into());
    }
    drop(b);
    drop(tensors);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"weight_map": map}).to_string(),
    )
    .unwrap();
    assert_names(
        &load_err(&dir),
        &[&twice, "appears twice", shards[0], shards[1]],
    );
}

/// The header limit (4 MiB) is the largest header read, not the first refused: the fixture's
/// header padded with spaces to exactly 4 MiB loads, one byte more is refused unread.
#[test]
fn a_header_of_exactly_the_limit_loads() {
    let (_tmp, dir) = copy_fixture();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let (header, data) = (&bytes[8..8 + len], &bytes[8 + len..]);
    let limit = 4 << 20;
    for size in [limit, limit + 1] {
        let mut padded = std::str::from_utf8(header).unwrap().to_string();
        padded.extend(std::iter::repeat_n(' ', size - len));
        write_raw_safetensors(&dir, &padded, data);
        match Model::load(&dir) {
            Ok(_) => assert_eq!(size, limit, "a header of {size} bytes loaded"),
            Err(e) => {
                assert_eq!(size, limit + 1, "{e}");
                assert_names(
                    &e.to_string(),
                    &["model.safetensors", &format!("header claims {size} bytes")],
                );
            }
        }
    }
}

/// With tie_word_embeddings set, a checkpoint that still holds lm_head.weight (some tied models
/// are saved with it) loads: the head is transformer.wte.weight, the saved copy is ignored.
#[test]
fn a_tied_config_over_a_saved_lm_head_loads_with_wte_as_the_head() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["tie_word_embeddings"] = true.into());
    let model = Model::load(&dir).unwrap();
    let w = model.weights();
    assert_eq!(w.lm_head.weight.to_f32(), w.wte.to_f32());
}

/// A config.json of another architecture is refused naming its model_type, even where its sizes
/// fit the weights; a null model_type is no claim.
#[test]
fn a_config_of_another_model_type_is_reported() {
    let (_tmp, dir) = copy_fixture();
    edit_config(&dir, |v| v["model_type"] = "gpt_neox".into());
    assert_names(
        &load_err(&dir),
        &[
            "config.json",
            "model_type is \"gpt_neox\", expected \"gptj\"",
        ],
    );
    edit_config(&dir, |v| v["model_type"] = serde_json::Value::Null);
    Model::load(&dir).unwrap();
}

/// convert's config.json names the new dtype in torch_dtype, and in dtype only where the source
/// config has that key (newer transformers write it): it adds no key the source did not have.
#[test]
fn convert_names_the_new_dtype_where_the_source_config_does() {
    let (tmp, dir) = copy_fixture();
    let config_of = |out: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap()
    };
    let bf16 = Some(toolsift::model::DType::BF16);
    let model = Model::load(&dir).unwrap();
    let out = tmp.path().join("without-dtype");
    toolsift::model::checkpoint::convert(&model, &out, bf16).unwrap();
    let cfg = config_of(&out);
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    assert!(cfg.get("dtype").is_none(), "{cfg}");
    drop(model);
    edit_config(&dir, |v| v["dtype"] = "float32".into());
    let model = Model::load(&dir).unwrap();
    let out = tmp.path().join("with-dtype");
    toolsift::model::checkpoint::convert(&model, &out, bf16).unwrap();
    let cfg = config_of(&out);
    assert_eq!(
        (&cfg["torch_dtype"], &cfg["dtype"]),
        (&"bfloat16".into(), &"bfloat16".into())
    );
}

/// A tokenizer.json that is a link to nothing is a broken folder, not one without a tokenizer.
#[cfg(unix)]
#[test]
fn tokenizer_json_that_is_a_dangling_link_is_reported() {
    let (_tmp, dir) = copy_fixture();
    let path = dir.join("tokenizer.json");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(dir.join("gone.json"), &path).unwrap();
    assert_names(
        &load_err(&dir),
        &[
            "tokenizer.json",
            "symbolic link to a file that does not exist",
        ],
    );
}
