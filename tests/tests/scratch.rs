//! `templates/runtime/scratch.rs`, the region that a LLaMA crate's session cuts its activation
//! buffers from: every buffer starts at zero, no two overlap, and each starts where its `Room`
//! says (a cache line, or the offset within a page of the memory it is copied to or from).

#[path = "../../templates/runtime/scratch.rs"]
mod scratch;

use scratch::{Room, Scratch};

#[test]
fn buffers_are_zero_apart_and_where_their_rooms_say() {
    // A cache's storage as the allocator places a large Vec (16 bytes into a page), and one at
    // an odd offset, which rounds down to a whole f32.
    let storage = vec![0f32; 1 << 20];
    let bytes = vec![0u8; 1 << 20];
    let odd = &bytes[4093..];
    let page = |p: *const f32| p as usize % 4096;
    let (_scratch, mut buffers) = Scratch::buffers([
        Room::new(1000),
        Room::like(300, &storage),
        Room::new(3),
        Room::like(77, odd),
        Room::new(0),
        Room::new(5000),
    ]);
    let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
    assert_eq!(lens, [1000, 300, 3, 77, 0, 5000]);
    assert_eq!(page(buffers[1].as_ptr()), page(storage.as_ptr()) / 4 * 4);
    assert_eq!(page(buffers[3].as_ptr()), page(odd.as_ptr().cast()) / 4 * 4);
    assert_ne!(page(odd.as_ptr().cast()) % 4, 0, "the odd offset is not a whole f32");
    for i in [0, 2, 4, 5] {
        assert_eq!(buffers[i].as_ptr() as usize % 64, 0, "buffer {i} is not on a cache line");
    }
    // In order, none overlapping the next.
    for pair in buffers.windows(2) {
        assert!(pair[0].as_ptr() as usize + pair[0].len() * 4 <= pair[1].as_ptr() as usize);
    }
    for (i, buffer) in buffers.iter_mut().enumerate() {
        assert!(buffer.iter().all(|&v| v == 0.0), "buffer {i} does not start at zero");
        buffer.fill(i as f32 + 1.0);
    }
    for (i, buffer) in buffers.iter().enumerate() {
        assert!(buffer.iter().all(|&v| v == i as f32 + 1.0), "buffer {i} was written by another");
    }
}
