//! Fuzz the response cache's disk file reader (a file an earlier run wrote, possibly cut short or damaged): what it accepts is a whole file whose parts add up, and it writes back the same.

#![no_main]

#[path = "../../crates/proxy/src/cache/file.rs"]
#[allow(dead_code)]
mod file;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(pre) = data.get(..file::PREAMBLE as usize) else {
        return;
    };
    let Ok(n) = file::head_len(pre.try_into().unwrap()) else {
        return;
    };
    let Some(raw) = data.get(file::PREAMBLE as usize..(file::PREAMBLE + n) as usize) else {
        return;
    };
    let Ok(meta) = file::meta(raw) else {
        return;
    };
    if !file::whole(data.len() as u64, n, &meta) {
        return;
    }
    assert!(data.starts_with(file::MAGIC));
    // Latin-1 values come back as the same text.
    for (_, v) in &meta.fields {
        if v.chars().all(|c| (c as u32) < 256) {
            assert_eq!(&file::latin1(&file::bytes(v)), v);
        }
    }
    // Written again, it reads back to the same head.
    let again = file::encode(&meta);
    let n2 = file::head_len(again[..20].try_into().unwrap()).unwrap();
    let back = file::meta(&again[20..]).unwrap();
    assert_eq!(n2 as usize, again.len() - 20);
    assert_eq!(serde_json::to_vec(&back).unwrap(), serde_json::to_vec(&meta).unwrap());
});
