// The sum of one value from each of a workgroup's 64 threads, on every
// thread: a tree in workgroup memory. Call it from every thread of the
// workgroup (it waits at barriers).

const WG: u32 = 64u;
var<workgroup> partial: array<f32, WG>;

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    partial[lid] = v;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            partial[lid] += partial[lid + half];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    // No thread may write `partial` again before every thread has read it.
    workgroupBarrier();
    return total;
}
