"""Verifier cases as data: programs (asm.py syntax) it must reject, with the message they get and the
instruction it names, and safe but tricky programs it must accept (PREVAIL's test-data in spirit).

Maps, by index: 0 counts (hash u32 -> u64), 1 arr (array u32 -> 64 bytes, 16 entries), 2 events
(ringbuf 4 KiB), 3 .rodata (readonly, u32 limit = 16 then zeros), 4 .bss (16 bytes), 5 perf
(perf_event_array).
"""

from __future__ import annotations

from typing import NamedTuple

from egpu_preload.bpf.program import (MAP_ARRAY, MAP_BLOOM_FILTER, MAP_HASH, MAP_PERF_EVENT_ARRAY, MAP_QUEUE,
                                      MAP_RINGBUF, MapDef)

MAPS = (
    MapDef("counts", MAP_HASH, 4, 8, 1024),
    MapDef("arr", MAP_ARRAY, 4, 64, 16),
    MapDef("events", MAP_RINGBUF, 0, 0, 4096),
    MapDef(".rodata", MAP_ARRAY, 4, 16, 1, initial=(16).to_bytes(4, "little") + bytes(12), readonly=True),
    MapDef(".bss", MAP_ARRAY, 4, 16, 1),
    MapDef("perf", MAP_PERF_EVENT_ARRAY, 4, 4, 0),
    MapDef("fifo", MAP_QUEUE, 0, 8, 4),
    MapDef("seen", MAP_BLOOM_FILTER, 0, 8, 16),
)


class Case(NamedTuple):
    name: str
    asm: str
    expect: str = ""           # rejections: a substring of the one-line reason
    at: int | None = None      # rejections: the instruction (slot) the reason names
    max_insns: int = 1_000_000
    gpu: bool = True           # acceptances: the GPU runs it too (not a host-only map's helpers)


# r0 = lookup(map N, key = u32 0 at fp-4), pc 0..6 (lddw takes two slots); N is filled in.
LOOKUP = """
    *(u32 *)(r10 - 4) = 0
    r2 = r10
    r2 += -4
    r1 = map[{m}] ll
    call map_lookup_elem
"""
LOOKUP_COUNTS = LOOKUP.format(m=0)   # next instruction is pc 6
LOOKUP_ARR = LOOKUP.format(m=1)
# r6 a 64-bit unknown whose low half, read as an int, is in [0, {hi}] by two signed 32-bit compares (the upper
# bound first: no unsigned range of the low half holds [S32_MIN, hi]), r0 an arr value; pc 0..10.
SIGNED_LOW_HALF = """
    call ktime_get_ns
    r6 = r0""" + LOOKUP_ARR + """
    if r0 == 0 goto out
    if w6 s> {hi} goto out
    if w6 s< 0 goto out
"""
# r0 = ringbuf_reserve(events, 16, 0), pc 0..5.
RESERVE = """
    r1 = map[2] ll
    r2 = 16
    r3 = 0
    call ringbuf_reserve
"""

# r6 = ctx, a 32-byte printk buffer at fp-32, pc 0..4; r2 is the length next.
PRINTK_BUF = """
    r6 = r1
    *(u64 *)(r10 - 8) = 0
    *(u64 *)(r10 - 16) = 0
    *(u64 *)(r10 - 24) = 0
    *(u64 *)(r10 - 32) = 0
"""

# bpf_loop(r1 rounds, cb, r3 = ctx, flags 0): set r1 and r3 first; the call is at pc 4 of it.
LOOP_CALL = """
    r2 = func cb ll
    r4 = 0
    call loop
"""
# perf_event_output(ctx, perf, BPF_F_CURRENT_CPU, fp - n, n), returning 0.
PERF_OUTPUT = """
    r4 = r10
    r4 += -{n}
    r2 = map[5] ll
    r3 = 0xffffffff ll
    r5 = {n}
    call perf_event_output
    r0 = 0
    exit"""
# r6 = 0 on the path explored first (the branch's fall-through), {big} on the other; both then reach `join`, pc 5.
PRECISION_FORK = """
    call get_prandom_u32
    r6 = 0
    if r0 == 0 goto big
    goto join
big:
    r6 = {big}
join:"""
# bpf_loop(4, cb, NULL, 0), pc 0..5, returning 0; the callback's code follows at pc 8.
LOOP_NULL = "r1 = 4\nr3 = 0\n" + LOOP_CALL + "r0 = 0\nexit\ncb:\n"

REJECT: tuple[Case, ...] = (
    # registers
    Case("uninit_register", "r0 = r2\nexit", "r2 is not initialized (!read_ok)", 0),
    Case("uninit_r0_at_exit", "exit", "r0 is not initialized at exit", 0),
    Case("write_r10", "r10 = 0\nr0 = 0\nexit", "r10 is the read-only frame pointer", 0),
    Case("add_to_r10", "r10 += 8\nr0 = 0\nexit", "r10 is the read-only frame pointer", 0),
    Case("load_into_r10", "r10 = *(u64 *)(r1 + 0x0)\nr0 = 0\nexit", "r10 is the read-only frame pointer", 0),
    Case("return_pointer", "r0 = r10\nexit", "r0 leaks addr as return value (r0 is stack)", 1),
    # control flow
    Case("fall_off_the_end", "r0 = 0", "falls off the end", 0),
    Case("fall_off_after_branch", "r0 = 0\nif r1 == 0 goto -0x2", "falls off the end", 1),
    Case("jump_out_of_range", "r0 = 0\nif r0 == 0 goto +5\nexit", "jump out of range", 1),
    Case("jump_backward_out_of_range", "r0 = 0\ngoto -3\nexit", "jump out of range", 1),
    Case("jump_into_lddw", "r0 = 0\ngoto +1\nr1 = 0x123456789 ll\nexit", "into the middle of lddw at 2", 1),
    Case("infinite_loop", "r0 = 0\nloop:\nr1 = 0\ngoto loop\nexit", "infinite loop detected", 1),
    Case("infinite_loop_unknown_scalar", """
        r0 = *(u64 *)(r1 + 0x0)
    loop:
        r0 |= 1
        if r0 != 0 goto loop
        exit""", "infinite loop detected", 1),
    # a loop inside one round of a callback, and one around the bpf_loop call: the rounds' bound ends neither
    Case("infinite_loop_inside_a_callback", LOOP_NULL + "r1 = 0\nloop: r1 += 0\ngoto loop\n", "infinite loop detected",
         9),
    Case("infinite_loop_around_a_loop_call", """
    top: r1 = 4
        r3 = 0""" + LOOP_CALL + """
        goto top
    cb: r0 = 0
        exit""", "infinite loop detected", 0),
    # w6 <= 8 bounds the low half to [0, 8], as Linux's u32 bounds do (arith.low_half); 8 is one past the value
    Case("jmp32_bound_one_past_the_value", """
        call get_prandom_u32
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        if w6 > 8 goto out
        w6 = w6
        r6 <<= 3
        r0 += r6
        r0 = *(u64 *)(r0 + 0)
    out: r0 = 0
        exit""", "invalid access to map value, value_size=64 off=0+[0, 64] size=8", 13),
    # the low half's bounds say nothing of the 64-bit value: used whole, it is still unbounded
    Case("jmp32_bound_is_not_the_whole_value", """
        call get_prandom_u32
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        if w6 > 5 goto out
        r6 <<= 3
        r0 += r6
        r0 = *(u64 *)(r0 + 0)
    out: r0 = 0
        exit""", "unbounded variable offset into map_value", 12),
    # w6 in [0, 64] by its signed low half (Linux's s32 bounds): 64 is one past the value
    Case("jmp32_signed_bound_one_past_the_value", SIGNED_LOW_HALF.format(hi=64) + """
        w6 = w6
        r0 += r6
        r0 = *(u8 *)(r0 + 0)
    out: r0 = 0
        exit""", "invalid access to map value, value_size=64 off=0+[0, 64] size=1", 13),
    Case("loop_too_complex", """
        r0 = 0
    loop:
        r0 += 1
        if r0 != 0 goto loop
        exit""", "program too complex", max_insns=5_000),
    Case("jump_out_of_function", """
        r0 = 0
        call local sub
        goto inside
        exit
    sub:
        r0 = 1
    inside:
        exit""", "jump out of the function", 2),
    Case("recursion", """
    main:
        r0 = 0
        call local main
        exit""", "recursive call to the function at 0", 1),
    Case("mutual_recursion", """
        call local f
        exit
    f:
        r0 = 0
        call local g
        exit
    g:
        call local f
        exit""", "recursive call to the function at 2", 5),   # named at the call that closes the cycle
    Case("call_depth", "\n".join(["r0 = 0", "call local f1", "exit"]
                                  + [f"f{i}:\ncall local f{i + 1}\nexit" for i in range(1, 9)]
                                  + ["f9:\nr0 = 0\nexit"]), "the call stack of 9 frames is too deep", 15),
    Case("combined_stack", """
        *(u64 *)(r10 - 512) = 0
        call local sub
        r0 = 0
        exit
    sub:
        *(u64 *)(r10 - 8) = 0
        r0 = 0
        exit""", "combined stack size of 2 calls is 544 (512 at pc 0, 32 at pc 4)", 1),
    Case("return_callee_stack", """
        call local sub
        exit
    sub:
        r0 = r10
        exit""", "cannot return a pointer to the callee's stack", 3),
    Case("store_callee_stack_in_caller", """
        r1 = r10
        r1 += -8
        call local sub
        r0 = 0
        exit
    sub:
        *(u64 *)(r1 + 0x0) = r10
        r0 = 0
        exit""", "cannot store a pointer to a callee's stack", 5),
    # stack
    Case("stack_below_frame", "*(u64 *)(r10 - 520) = 0\nr0 = 0\nexit", "invalid stack access off=-520", 0),
    Case("stack_above_fp", "*(u32 *)(r10 + 0) = 0\nr0 = 0\nexit", "invalid stack access off=0", 0),
    Case("uninit_stack_read", "r0 = *(u64 *)(r10 - 8)\nexit", "not initialized (stack init)", 0),
    Case("partly_uninit_stack_read", "*(u32 *)(r10 - 8) = 0\nr0 = *(u64 *)(r10 - 8)\nexit",
         "not initialized (stack init)", 1),
    Case("misaligned_stack", "*(u64 *)(r10 - 12) = r1\nr0 = 0\nexit", "misaligned stack access", 0),
    Case("partial_pointer_spill", "*(u32 *)(r10 - 8) = r1\nr0 = 0\nexit", "invalid size 4 of a pointer spill", 0),
    Case("partial_pointer_fill", "*(u64 *)(r10 - 8) = r1\nr0 = *(u32 *)(r10 - 8)\nexit",
         "read of a spilled ctx (register fill)", 1),
    Case("variable_stack_read_uninit", """
        r2 = *(u32 *)(r1 + 0x1c)
        if r2 > 7 goto out
        *(u32 *)(r10 - 8) = 0
        r3 = r10
        r3 += -16
        r3 += r2
        r0 = *(u8 *)(r3 + 0x0)
        exit
    out:
        r0 = 0
        exit""", "invalid variable-offset read from stack", 6),
    # a signed byte read at a variable offset is [-128, 127]: taken as [0, 255], "s> 56" let -128 index arr
    Case("variable_stack_signed_load", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r7 = r0
        r1 = 0x8080808080808080 ll
        *(u64 *)(r10 - 16) = r1
        r1 = *(u32 *)(r6 + 0x1c)
        r1 &= 7
        r2 = r10
        r2 += -16
        r2 += r1
        r0 = *(s8 *)(r2 + 0x0)
        if r0 s> 56 goto out
        r7 += r0
        r0 = *(u8 *)(r7 + 0x0)
    out:
        r0 = 0
        exit""", "invalid access to map value, value_size=64 off=0+[-128, 56] size=1", 20),
    # ctx
    Case("ctx_write", "*(u64 *)(r1 + 0x0) = 0\nr0 = 0\nexit", "cannot write into ctx", 0),
    Case("ctx_write_through_copy", "r2 = r1\nr2 += 8\n*(u32 *)(r2 + 0x0) = 1\nr0 = 0\nexit",
         "cannot write into ctx", 2),
    Case("ctx_out_of_bounds", "r0 = *(u64 *)(r1 + 0x90)\nexit", "invalid ctx access off=144 size=8", 0),
    Case("ctx_across_fields", "r0 = *(u64 *)(r1 + 0x18)\nexit", "invalid ctx access off=24 size=8 (struct egpu_ctx is "
         "144 bytes of aligned fields: the read spans site and size, as clang reads a struct copied whole", 0),
    Case("ctx_negative_offset", "r1 += -8\nr0 = *(u64 *)(r1 + 0x0)\nexit", "invalid ctx access off=-8", 1),
    Case("ctx_variable_offset", """
        r2 = *(u32 *)(r1 + 0x68)
        if r2 > 7 goto out
        r2 <<= 3
        r1 += r2
        r0 = *(u64 *)(r1 + 0x28)
        exit
    out:
        r0 = 0
        exit""", "variable ctx access prohibited", 4),
    Case("ctx_atomic", "r2 = 1\nlock *(u64 *)(r1 + 0x0) += r2\nr0 = 0\nexit", "atomic access to ctx prohibited", 1),
    # maps
    Case("map_value_not_null_checked", LOOKUP_COUNTS + "r0 = *(u64 *)(r0 + 0x0)\nexit",
         "invalid mem access 'map_value_or_null'", 6),
    # Linux 6.14 elides the NULL check only for an array's key known below max_entries (can_elide_value_nullness)
    Case("array_key_past_the_end_not_null_checked", LOOKUP_ARR.replace("= 0", "= 16") + "r0 = *(u64 *)(r0 + 0x0)\n"
         "exit", "invalid mem access 'map_value_or_null'", 6),
    Case("array_key_unknown_not_null_checked", """
        call get_prandom_u32
        r0 &= 7
        *(u32 *)(r10 - 4) = r0
        r2 = r10
        r2 += -4
        r1 = map[1] ll
        call map_lookup_elem
        r0 = *(u64 *)(r0 + 0x0)
        exit""", "invalid mem access 'map_value_or_null'", 8),
    Case("map_value_checked_on_wrong_branch", LOOKUP_COUNTS + """
        if r0 != 0 goto out
        r1 = *(u64 *)(r0 + 0x0)
    out:
        r0 = 0
        exit""", "invalid mem access 'scalar'", 7),
    Case("map_value_past_end", LOOKUP_ARR + """
        if r0 == 0 goto out
        r0 = *(u64 *)(r0 + 0x40)
    out:
        exit""", "invalid access to map value, value_size=64 off=64 size=8", 7),
    Case("map_value_negative_offset", LOOKUP_ARR + """
        if r0 == 0 goto out
        r0 += -8
        r0 = *(u64 *)(r0 + 0x0)
    out:
        exit""", "invalid access to map value, value_size=64 off=-8", 8),
    Case("map_value_index_off_by_one", "r7 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r6 = r0
        r0 = 0
        r1 = *(u32 *)(r7 + 0x1c)
        if r1 > 64 goto out
        r6 += r1
        r0 = *(u8 *)(r6 + 0x0)
    out:
        exit""", "invalid access to map value, value_size=64 off=0+[0, 64] size=1", 13),
    Case("map_value_index_unchecked", "r7 = r1" + LOOKUP_ARR + """
        r6 = r0
        r7 = *(u32 *)(r7 + 0x1c)
        if r6 == 0 goto out
        r6 += r7
        r0 = *(u8 *)(r6 + 0x0)
        exit
    out:
        r0 = 0
        exit""", "unbounded variable offset into map_value", 11),
    Case("signed_load_index_too_big", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = *(s8 *)(r6 + 0x1c)
        if r1 s< 0 goto out
        r0 += r1
        r0 = *(u8 *)(r0 + 0x0)
    out:
        r0 = 0
        exit""", "invalid access to map value, value_size=64 off=0+[0, 127] size=1", 11),
    Case("map_value_misaligned", LOOKUP_ARR + """
        if r0 == 0 goto out
        r0 = *(u64 *)(r0 + 0x4)
    out:
        exit""", "misaligned map_value access off=4 size=8", 7),
    Case("map_ptr_dereference", "r1 = map[0] ll\nr0 = *(u64 *)(r1 + 0x0)\nexit", "invalid mem access 'map_ptr'", 2),
    Case("scalar_dereference", "r1 = 0x1000\nr0 = *(u64 *)(r1 + 0x0)\nexit", "invalid mem access 'scalar'", 1),
    Case("pointer_leak_into_map", LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r0 + 0x0) = r10
    out:
        r0 = 0
        exit""", "r10 leaks addr into map_value", 7),
    Case("rodata_write", "r1 = map_value[3] + 0x0 ll\n*(u32 *)(r1 + 0x0) = 1\nr0 = 0\nexit",
         "write into read-only map .rodata", 2),
    Case("rodata_atomic", "r1 = map_value[3] + 0x8 ll\nr2 = 1\nlock *(u64 *)(r1 + 0x0) += r2\nr0 = 0\nexit",
         "write into read-only map .rodata", 3),
    Case("bss_past_end", "r1 = map_value[4] + 0x8 ll\nr0 = *(u64 *)(r1 + 0x8)\nexit",
         "invalid access to map value, value_size=16 off=16", 2),
    Case("map_index_out_of_range", "r1 = map[9] ll\nr0 = 0\nexit", "map index 9 out of range", 0),
    Case("unsupported_lddw_source", "ld_pseudo r1, 0x1, 0x3\nr0 = 0\nexit", "unsupported lddw pseudo source 1", 0),
    Case("direct_value_of_hash_map", "r1 = map_value[0] + 0x0 ll\nr0 = 0\nexit",
         "direct value access needs a single-entry array map", 0),
    # pointer arithmetic and comparisons
    Case("arith_on_or_null", LOOKUP_COUNTS + "r0 += 8\nr0 = 0\nexit",
         "pointer arithmetic on map_value_or_null prohibited", 6),
    Case("pointer_multiply", "r1 *= 2\nr0 = 0\nexit", "pointer arithmetic with mul prohibited (r1 is ctx)", 0),
    Case("pointer_32bit_add", "w1 += 1\nr0 = 0\nexit", "32-bit arithmetic on a pointer prohibited", 0),
    Case("pointer_partial_copy", "w2 = w10\nr0 = 0\nexit", "partial copy of a pointer", 0),
    Case("pointer_plus_pointer", "r1 += r10\nr0 = 0\nexit", "pointer += pointer prohibited", 0),
    Case("pointer_minus_other_region", "r1 -= r10\nr0 = r1\nexit", "subtraction of pointers to different regions", 0),
    # two lookups of one array: the same offsets, 15 values apart; taken for 0, the distance let a store
    # through r10 - 16 + 960 pass (on the GPU, past the frame)
    Case("pointer_minus_two_lookups", LOOKUP_ARR + """
        if r0 == 0 goto out
        r6 = r0
        *(u32 *)(r10 - 4) = 15
        r2 = r10
        r2 += -4
        r1 = map[1] ll
        call map_lookup_elem
        if r0 == 0 goto out
        r0 -= r6
        r2 = r10
        r2 += -16
        r2 += r0
        *(u64 *)(r2 + 0x0) = 0
    out:
        r0 = 0
        exit""", "unbounded variable offset into stack", 19),
    Case("pointer_jset", "r0 = 0\nif r1 & r10 goto +0\nexit", "jset tests an address's bits", 1),
    Case("pointer_ordering_then_deref", LOOKUP_COUNTS + "r6 = r0\nr1 = map[0] ll\nr2 = r10\nr2 += -4\n"
         "call map_lookup_elem\nif r6 < r0 goto +1\nr0 = *(u64 *)(r6 + 0x0)\nr0 = 0\nexit",
         "an order between two regions differs between the VM and the GPU", 12),   # nor says it anything of null
    # p <= end proves nothing of p's offset (the kernel learns bounds only between packet pointers)
    Case("pointer_ordering_learns_no_bounds", "r9 = r1" + RESERVE + """
        if r0 == 0 goto out
        r1 = *(u32 *)(r9 + 0x1c)
        r1 &= 0xf8
        r6 = r0
        r6 += r1
        r7 = r0
        r7 += 8
        if r6 > r7 goto drop
        r5 = *(u64 *)(r6 + 0x0)
    drop:
        r1 = r0
        r2 = 0
        call ringbuf_discard
    out:
        r0 = 0
        exit""", "invalid access to ringbuf record, size=16 off=0+[0, 248] size=8", 14),
    # An order of two regions is the VM's order of first lookup, but by key in C and on the GPU; JMP32 sees
    # a region's offset on the VM and in C (bases at multiples of 2**36), the address's low half on the GPU.
    Case("pointer_ordering_two_values", LOOKUP_COUNTS + "r6 = r0\nr1 = map[0] ll\nr2 = r10\nr2 += -4\n"
         "call map_lookup_elem\nif r6 < r0 goto +0\nr0 = 0\nexit",
         "an order between two regions differs between the VM and the GPU", 12),
    Case("pointer_ordering_with_stack", LOOKUP_ARR + "if r0 == 0 goto +1\nif r0 s> r10 goto +0\nr0 = 0\nexit",
         "an order between two regions differs between the VM and the GPU", 7),
    Case("pointer_ordering_two_records", RESERVE + "r6 = r0\n" + RESERVE + "if r6 < r0 goto +0\nr0 = 0\nexit",
         "an order between two regions differs between the VM and the GPU", 11),
    Case("pointer_jmp32_equality", LOOKUP_COUNTS + "r6 = r0\nr1 = map[0] ll\nr2 = r10\nr2 += -4\n"
         "call map_lookup_elem\nif w6 == w0 goto +0\nr0 = 0\nexit", "JMP32 compares an address's low half", 12),
    Case("pointer_jmp32_ordering_in_one_frame", "r1 = r10\nr1 += -8\nif w1 < w10 goto +0\nr0 = 0\nexit",
         "JMP32 compares an address's low half", 2),
    Case("pointer_equality_then_deref", LOOKUP_COUNTS + "r6 = r0\nr1 = map[0] ll\nr2 = r10\nr2 += -4\n"
         "call map_lookup_elem\nif r6 != r0 goto +1\nr0 = *(u64 *)(r6 + 0x0)\nr0 = 0\nexit",
         "invalid mem access 'map_value_or_null'", 13),   # equal says nothing of null
    Case("pointer_compare_nonzero", "r0 = 0\nif r1 == 5 goto +0\nexit", "only == 0 and != 0 null checks", 1),
    Case("pointer_jmp32", "r0 = 0\nif w1 == 0 goto +0\nexit", "pointer comparison prohibited", 1),
    Case("pointer_neg", "r1 = -r1\nr0 = 0\nexit", "neg of a pointer prohibited", 0),
    # helpers
    Case("unknown_helper", "call 999\nr0 = 0\nexit", "invalid func unknown#999 (helper id)", 0),
    Case("unknown_bpftime_helper", "call 512\nr0 = 0\nexit", "invalid func unknown#512 (an id in bpftime's GPU "
         "helpers' range that egpu does not provide: it provides 502-511)", 0),
    Case("bpftime_puts", "call 501\nr0 = 0\nexit", "unknown func ebpf_puts#501 (bpftime's GPU helper egpu does "
         "not provide: print with bpf_printk, whose format may be the string)", 0),
    Case("kfunc", "call kfunc 7\nr0 = 0\nexit", "kfunc calls are not supported", 0),
    Case("helper_map_arg_not_a_map", "r1 = 0\nr2 = r10\nr2 += -8\ncall map_lookup_elem\nr0 = 0\nexit",
         "r1 is scalar, map_lookup_elem needs a map", 3),
    Case("helper_arg_uninit", "r1 = map[0] ll\ncall map_lookup_elem\nr0 = 0\nexit", "r2 is not initialized", 2),
    Case("helper_key_uninit_stack", "r2 = r10\nr2 += -4\nr1 = map[0] ll\ncall map_lookup_elem\nr0 = 0\nexit",
         "not initialized (map_lookup_elem arg2)", 4),
    Case("helper_key_padding", "*(u16 *)(r10 - 4) = 1\nr2 = r10\nr2 += -4\nr1 = map[0] ll\ncall map_lookup_elem\n"
         "r0 = 0\nexit", "not initialized (map_lookup_elem arg2); 2 of its 4 bytes written: a struct's padding?", 5),
    Case("record_padding_beside_a_spilled_pointer", "*(u64 *)(r10 - 8) = r10" + PERF_OUTPUT.format(n=16),
         "r4 leaks addr into perf_event_output: fp-8 holds", 8),
    Case("helper_key_outside_stack", "r2 = r10\nr1 = map[0] ll\ncall map_lookup_elem\nr0 = 0\nexit",
         "invalid stack access off=0 size=4", 3),
    Case("helper_value_too_small", """
        *(u32 *)(r10 - 4) = 0
        *(u32 *)(r10 - 8) = 0
        r2 = r10
        r2 += -4
        r3 = r10
        r3 += -4
        r1 = map[0] ll
        r4 = 0
        call map_update_elem
        r0 = 0
        exit""", "invalid stack access off=-4 size=8", 9),
    Case("helper_pointer_leak", """
        *(u32 *)(r10 - 4) = 0
        *(u64 *)(r10 - 16) = 0
        r2 = r10
        r2 += -4
        r3 = r10
        r3 += -16
        r1 = map[0] ll
        r4 = r10
        call map_update_elem
        r0 = 0
        exit""", "r4 leaks addr into map_update_elem", 9),
    Case("helper_key_holds_pointer", """
        *(u64 *)(r10 - 8) = r1
        r2 = r10
        r2 += -8
        r1 = map[0] ll
        call map_lookup_elem
        r0 = 0
        exit""", "r2 leaks addr into map_lookup_elem", 5),
    Case("update_readonly_map", """
        *(u32 *)(r10 - 4) = 0
        r2 = r10
        r2 += -4
        r3 = r2
        r1 = map[3] ll
        r4 = 0
        call map_update_elem
        r0 = 0
        exit""", "write into read-only map .rodata", 7),
    Case("lookup_on_ringbuf", LOOKUP.format(m=2) + "r0 = 0\nexit",
         "map events of type ringbuf cannot be used with map_lookup_elem", 5),
    Case("lookup_on_queue", LOOKUP.format(m=6) + "r0 = 0\nexit",
         "map fifo of type queue cannot be used with map_lookup_elem", 5),
    Case("pop_on_bloom_filter", """
        r2 = r10
        r2 += -8
        r1 = map[7] ll
        call map_pop_elem
        exit""", "map seen of type bloom_filter cannot be used with map_pop_elem", 4),
    Case("push_on_hash", """
        *(u64 *)(r10 - 8) = 0
        r2 = r10
        r2 += -8
        r1 = map[0] ll
        r3 = 0
        call map_push_elem
        exit""", "map counts of type hash cannot be used with map_push_elem", 6),
    # a bloom filter's peek reads the value it tests (a queue's fills it in): it must be initialized
    Case("bloom_peek_of_uninit_value", """
        r2 = r10
        r2 += -8
        r1 = map[7] ll
        call map_peek_elem
        exit""", "invalid read from stack off=-8 size=1: not initialized (map_peek_elem arg2)", 4),
    Case("push_of_a_short_value", """
        *(u32 *)(r10 - 4) = 0
        r2 = r10
        r2 += -4
        r1 = map[6] ll
        r3 = 0
        call map_push_elem
        exit""", "invalid stack access off=-4 size=8", 6),
    Case("bloom_filter_value_padding", """
        *(u32 *)(r10 - 8) = 1
        r2 = r10
        r2 += -8
        r1 = map[7] ll
        r3 = 0
        call map_push_elem
        exit""", "not initialized (map_push_elem arg2); 4 of its 8 bytes written: a struct's padding?", 6),
    Case("ringbuf_output_on_hash", """
        *(u64 *)(r10 - 8) = 0
        r2 = r10
        r2 += -8
        r1 = map[0] ll
        r3 = 8
        r4 = 0
        call ringbuf_output
        r0 = 0
        exit""", "map counts of type hash cannot be used with ringbuf_output", 7),
    Case("perf_output_on_array", """
        *(u64 *)(r10 - 8) = 0
        r4 = r10
        r4 += -8
        r2 = map[1] ll
        r3 = 0
        r5 = 8
        call perf_event_output
        r0 = 0
        exit""", "map arr of type array cannot be used with perf_event_output", 7),
    Case("perf_output_ctx_not_ctx", """
        *(u64 *)(r10 - 8) = 0
        r4 = r10
        r4 += -8
        r1 = r4
        r2 = map[5] ll
        r3 = 0
        r5 = 8
        call perf_event_output
        r0 = 0
        exit""", "r1 is stack, perf_event_output needs the unmodified ctx pointer", 8),
    Case("printk_unbounded_size", """
        r2 = *(u32 *)(r1 + 0x1c)
        *(u64 *)(r10 - 8) = 0
        r1 = r10
        r1 += -8
        call trace_printk
        r0 = 0
        exit""", "r2 unbounded memory access", 4),
    Case("printk_size_past_buffer", """
        *(u64 *)(r10 - 8) = 0
        r1 = r10
        r1 += -8
        r2 = 9
        call trace_printk
        r0 = 0
        exit""", "invalid stack access off=-8 size=9", 4),
    Case("u64_out_to_ctx", "r2 = r10\nr2 += -8\nr3 = r2\ncall get_thread_idx\nr0 = 0\nexit",
         "r1 is ctx, get_thread_idx needs a pointer to stack or map memory", 3),
    # get_current_comm writes its buffer (Linux's ARG_PTR_TO_UNINIT_MEM): one in read-only data, or past the frame,
    # is refused
    Case("comm_into_rodata", "r1 = map_value[3] + 0x0 ll\nr2 = 16\ncall get_current_comm\nr0 = 0\nexit",
         "(arg1 of get_current_comm)", 3),
    Case("comm_past_the_frame", "r1 = r10\nr1 += -8\nr2 = 16\ncall get_current_comm\nr0 = 0\nexit",
         "invalid stack access off=-8 size=16", 3),
    # ringbuf references
    Case("ringbuf_submit_unchecked", RESERVE + """
        r1 = r0
        r2 = 0
        call ringbuf_submit
        r0 = 0
        exit""", "r1 is ringbuf_mem_or_null, ringbuf_submit needs a record from ringbuf_reserve (arg1: compare", 7),
    Case("ringbuf_reserve_unknown_size", """
        r2 = *(u32 *)(r1 + 0x1c)
        r1 = map[2] ll
        r3 = 0
        call ringbuf_reserve
        r0 = 0
        exit""", "r2 is not a constant: ringbuf_reserve needs a size known when verifying", 4),
    Case("ringbuf_reserve_too_big", "r1 = map[2] ll\nr2 = 8192\nr3 = 0\ncall ringbuf_reserve\nr0 = 0\nexit",
         "record of 8192 bytes exceeds ringbuf events", 4),
    Case("ringbuf_leak", RESERVE + """
        if r0 == 0 goto out
        *(u64 *)(r0 + 0x0) = 1
    out:
        r0 = 0
        exit""", "unreleased reference id=1 from ringbuf_reserve at 4", 8),
    Case("ringbuf_leak_on_one_path", "r7 = r1" + RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        r1 = *(u32 *)(r7 + 0x1c)
        if r1 > 3 goto out
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "unreleased reference id=1 from ringbuf_reserve at 5", 14),
    Case("ringbuf_leak_on_branch", RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        call ktime_get_ns
        if r0 > 3 goto out
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "unreleased reference", 13),
    Case("ringbuf_unchecked_use", RESERVE + "*(u64 *)(r0 + 0x0) = 1\nr0 = 0\nexit",
         "invalid mem access 'ringbuf_mem_or_null'", 5),
    Case("ringbuf_use_after_submit", RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        r1 = r0
        r2 = 0
        call ringbuf_submit
        *(u64 *)(r6 + 0x0) = 1
    out:
        r0 = 0
        exit""", "r6 is not initialized", 10),
    Case("ringbuf_submit_inner_pointer", RESERVE + """
        if r0 == 0 goto out
        r1 = r0
        r1 += 8
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "points inside the record (off=8)", 9),
    Case("ringbuf_record_past_end", RESERVE + """
        if r0 == 0 goto out
        *(u64 *)(r0 + 0x10) = 1
        r1 = r0
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "invalid access to ringbuf record, size=16 off=16", 6),
    # atomics on a record: within it, aligned, after the null check, and with no address as the operand
    Case("ringbuf_atomic_past_end", RESERVE + """
        if r0 == 0 goto out
        r1 = 1
        lock *(u64 *)(r0 + 0x10) += r1
        r1 = r0
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "invalid access to ringbuf record, size=16 off=16 size=8", 7),
    Case("ringbuf_atomic_misaligned", RESERVE + """
        if r0 == 0 goto out
        w1 = 1
        lock *(u32 *)(r0 + 0x6) += w1
        r1 = r0
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "misaligned ringbuf_mem access off=6 size=4", 7),
    Case("ringbuf_atomic_unchecked", RESERVE + "r1 = 1\nlock *(u64 *)(r0 + 0x0) += r1\nr0 = 0\nexit",
         "invalid mem access 'ringbuf_mem_or_null'", 6),
    Case("ringbuf_xchg_pointer", RESERVE + """
        if r0 == 0 goto out
        r1 = r10
        r1 = xchg_64(r0 + 0x0, r1)
        r1 = r0
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "r1 leaks addr into memory (atomic operand is stack)", 7),
    Case("submit_map_value", LOOKUP_COUNTS + """
        if r0 == 0 goto out
        r1 = r0
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "r1 is map_value, ringbuf_submit needs a record from ringbuf_reserve", 9),
    # bpftime's exit (helper 507) ends the probe: from any frame, nothing may stay reserved
    Case("ringbuf_leak_at_bpf_exit", "r7 = r1" + RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        r1 = *(u32 *)(r7 + 0x18)
        if r1 == 0 goto submit
        call exit
    submit:
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit""", "unreleased reference id=1 from ringbuf_reserve at 5: submit or discard it before bpf_exit()", 10),
    Case("ringbuf_leak_at_bpf_exit_in_subprogram", RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        call local stop
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit
    stop:
        call exit
        r0 = 0
        exit""", "unreleased reference id=1 from ringbuf_reserve at 4: submit or discard it before bpf_exit()", 13),
    # pointers never reach a map: a spilled pointer is replaced whole or not at all, and a released one is gone
    Case("spilled_pointer_byte_overwrite", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r10
        *(u8 *)(r10 - 16) = 0
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r0 + 0x0) = r1
    out:
        r0 = 0
        exit""", "attempt to corrupt spilled stack at fp-16 with a 1-byte store", 9),
    Case("spilled_pointer_top_half_overwrite", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r6
        w1 = 0
        *(u32 *)(r10 - 12) = w1
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r0 + 0x0) = r1
    out:
        r0 = 0
        exit""", "attempt to corrupt spilled ctx at fp-16 with a 4-byte store", 10),
    Case("spilled_pointer_variable_offset_overwrite", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r0
        r1 = *(u32 *)(r6 + 0x18)
        r1 &= 7
        r2 = r10
        r2 += -16
        r2 += r1
        *(u8 *)(r2 + 0) = 0
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r0 + 0x0) = r1
    out:
        r0 = 0
        exit""", "spilled map_value at fp-16 in range of a variable-offset stack write", 14),
    Case("spilled_pointer_helper_half_overwrite", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r0
        *(u64 *)(r10 - 24) = 0
        r1 = r10
        r1 += -20
        r2 = r10
        r2 += -32
        r3 = r2
        call get_block_idx
        r0 = 0
    out:
        exit""", "get_block_idx may overwrite part of the spilled map_value at fp-16", 15),
    Case("spilled_record_after_submit", RESERVE + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 8) = r0
        r1 = r0
        r2 = 0
        call ringbuf_submit
        r1 = *(u64 *)(r10 - 8)
        r2 = map_value[4] + 0x0 ll
        *(u64 *)(r2 + 0x0) = r1
    out:
        r0 = 0
        exit""", "invalid read from stack off=-8 size=8: not initialized", 10),
    # pruning: a path that spilled a scalar does not cover one that spilled a pointer (64 or 32 bits)
    Case("pruning_keeps_a_spilled_pointer_apart_from_a_scalar", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        r7 = r0
        r1 = *(u32 *)(r6 + 0x18)
        *(u64 *)(r10 - 16) = r6
        if r1 == 0 goto merge
        *(u64 *)(r10 - 16) = r1
    merge:
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r7 + 0x0) = r1
    out:
        r0 = 0
        exit""", "r1 leaks addr into map_value", 14),
    Case("pruning_keeps_a_spilled_pointer_apart_from_a_32bit_spill", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        r7 = r0
        r1 = *(u32 *)(r6 + 0x18)
        *(u64 *)(r10 - 16) = 0
        if r1 == 0 goto pointer
        *(u32 *)(r10 - 16) = w1
        goto merge
    pointer:
        *(u64 *)(r10 - 16) = r6
    merge:
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r7 + 0x0) = r1
    out:
        r0 = 0
        exit""", "r1 leaks addr into map_value", 16),
    # precision (verifier/precision.py): the path explored first reaches `join` with r6 = 0 and is safe, the other
    # brings a value the first path's checks read there (an offset, a branch decided, a size), so it is not pruned
    Case("precision_offset", PRECISION_FORK.format(big=64) + LOOKUP_ARR + """
        if r0 == 0 goto out
        r0 += r6
        r0 = *(u64 *)(r0 + 0)
    out:
        r0 = 0
        exit""", "value_size=64 off=64 size=8", 13),
    Case("precision_through_a_spill", """
        call get_prandom_u32
        *(u64 *)(r10 - 16) = 0
        if r0 == 0 goto big
        goto join
    big:
        r1 = 64
        *(u64 *)(r10 - 16) = r1
    join:""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = *(u64 *)(r10 - 16)
        r0 += r1
        r0 = *(u64 *)(r0 + 0)
    out:
        r0 = 0
        exit""", "value_size=64 off=64 size=8", 15),
    Case("precision_decided_branch", PRECISION_FORK.format(big=1) + LOOKUP_ARR + """
        if r0 == 0 goto out
        if r6 == 0 goto out
        r0 = *(u64 *)(r0 + 64)
    out:
        r0 = 0
        exit""", "value_size=64 off=64 size=8", 13),
    # r7 is no check's, but the first path's r7 bounds r6 through their link; the other's r7 does not
    Case("precision_linked", """
        call get_prandom_u32
        r6 = r0
        call get_prandom_u32
        if r0 == 0 goto other
        r7 = r6
        goto join
    other:
        r8 = r6
        call get_prandom_u32
        r7 = r0
    join:
        if r7 > 7 goto out""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r6 <<= 3
        r0 += r6
        r0 = *(u64 *)(r0 + 0)
    out:
        r0 = 0
        exit""", "unbounded variable offset into map_value", 19),
    # r8 is a copy of r6: comparing r6 with r9 bounds r8 by r9, which is then no register of the offset's own
    Case("precision_through_a_linked_compare", """
        call get_prandom_u32
        r6 = r0
        r8 = r6
        call get_prandom_u32
        r9 = 8
        if r0 == 0 goto big
        goto join
    big:
        r9 = 200
    join:
        if r6 > r9 goto out""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r0 += r8
        r0 = *(u8 *)(r0 + 0)
    out:
        r0 = 0
        exit""", "value_size=64 off=0+[0, 200] size=1", 17),
    Case("precision_callee_arg", PRECISION_FORK.format(big=64) + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = r0
        r2 = r6
        call local sub
    out:
        r0 = 0
        exit
    sub:
        r1 += r2
        r0 = *(u64 *)(r1 + 0)
        exit""", "value_size=64 off=64 size=8", 18),
    Case("precision_callee_result", PRECISION_FORK.format(big=64) + """
        r1 = r6
        call local sub
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r0 += r6
        r0 = *(u64 *)(r0 + 0)
    out:
        r0 = 0
        exit
    sub:
        r0 = r1
        exit""", "value_size=64 off=64 size=8", 16),
    Case("precision_callback_index", PRECISION_FORK.replace("r6 = 0", "r6 = 1").format(big=9) + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = r6
        r3 = r0""" + LOOP_CALL + """
    out:
        r0 = 0
        exit
    cb:
        r1 <<= 3
        r2 += r1
        r0 = *(u64 *)(r2 + 0)
        r0 = 0
        exit""", "value_size=64 off=0+[0, 64] size=8", 22),
    Case("precision_size", PRECISION_FORK.replace("r6 = 0", "r6 = 8").format(big=16) + """
        r1 = r10
        r1 += -8
        r2 = r6
        call get_current_comm
        r0 = 0
        exit""", "invalid stack access off=-8 size=16", 8),
    # a subprogram may leave r0 unset; its caller may then not read it
    Case("subprogram_r0_unset_and_read", "call local sub\nr1 = r0\nr0 = 0\nexit\nsub:\nexit",
         "r0 is not initialized (!read_ok)", 1),
    Case("subprogram_r0_unset_and_returned", "call local sub\nexit\nsub:\nexit",
         "r0 is not initialized at exit", 1),
    # linked scalars: what does not hold must not be learnt
    Case("w32_copy_of_a_64bit_value_is_not_linked", PRINTK_BUF + """
        r2 = *(u64 *)(r6 + 0x0)
        w3 = w2
        w3 += -1
        if w3 > 31 goto out
        r1 = r10
        r1 += -32
        call trace_printk
    out:
        r0 = 0
        exit""", "r2 min value is negative", 11),
    Case("linked_copy_keeps_its_distance", PRINTK_BUF + """
        w2 = *(u32 *)(r6 + 0x1c)
        r3 = r2
        r3 += -100
        if r3 > 31 goto out
        r1 = r10
        r1 += -32
        call trace_printk
    out:
        r0 = 0
        exit""", "invalid stack access off=-32 size=131", 11),
    Case("w32_linked_copy_keeps_its_distance", PRINTK_BUF + """
        w2 = *(u32 *)(r6 + 0x1c)
        w3 = w2
        w3 += -100
        if w3 > 31 goto out
        r1 = r10
        r1 += -32
        call trace_printk
    out:
        r0 = 0
        exit""", "invalid stack access off=-32 size=131", 11),
    Case("link_broken_by_mul", PRINTK_BUF + """
        w2 = *(u32 *)(r6 + 0x1c)
        r3 = r2
        r3 *= 2
        if r3 > 31 goto out
        r1 = r10
        r1 += -32
        call trace_printk
    out:
        r0 = 0
        exit""", "r2 unbounded memory access", 11),
    # atomics
    Case("atomic_pointer_operand", "*(u64 *)(r10 - 8) = 0\nr2 = r10\nlock *(u64 *)(r10 - 0x8) += r2\nr0 = 0\nexit",
         "r2 leaks addr into memory", 2),
    Case("narrow_fill_of_other_bytes", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r7 = r0
        w1 = *(u32 *)(r6 + 0x1c)
        if w1 > 63 goto out
        *(u32 *)(r10 - 8) = w1
        call get_lane_id
        w1 = *(u16 *)(r10 - 6)
        r7 += r1
        r0 = *(u8 *)(r7 + 0x0)
        exit
    out:
        r0 = 0
        exit""",
         "invalid access to map value, value_size=64 off=0+[0, 65535] size=1", 15),
    Case("atomic_uninit_stack", "r2 = 1\nlock *(u64 *)(r10 - 0x8) += r2\nr0 = 0\nexit",
         "not initialized (stack init)", 1),

    # held in the adversarial sweep: each would reach past its region on the GPU if accepted
    Case("bound_checked_only_in_jmp32", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto +5
        r3 = *(u64 *)(r6 + 0x0)
        if w3 > 56 goto +3
        r0 += r3
        w1 = *(u8 *)(r0 + 0x0)
        r0 = 0
        exit""", "unbounded variable offset into map_value", 11),
    Case("spill_made_before_the_bound_check_stays_unbounded", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto +6
        r3 = *(u64 *)(r6 + 0x0)
        *(u64 *)(r10 - 0x10) = r3
        if r3 > 56 goto +3
        r3 = *(u64 *)(r10 - 0x10)
        r0 += r3
        w1 = *(u8 *)(r0 + 0x0)
        r0 = 0
        exit""", "unbounded variable offset into map_value", 13),
    Case("loop_bound_off_by_one", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto +7
        r7 = r0
        r4 = 0
    loop:
        r5 = r7
        r5 += r4
        *(u8 *)(r5 + 0x0) = 1
        r4 += 1
        if r4 <= 64 goto loop
        r0 = 0
        exit""", "invalid access to map value, value_size=64 off=64 size=1", 12),
    Case("loop_walks_below_the_frame", """
        r2 = r10
        r4 = 0
    loop:
        r2 += -8
        *(u64 *)(r2 + 0x0) = 0
        r4 += 1
        if r4 < 65 goto loop
        r0 = 0
        exit""", "invalid stack access off=-520 size=8", 3),
    Case("subprogram_writes_below_callers_frame", """
        r1 = r10
        r1 += -8
        call local sub
        r0 = 0
        exit
    sub:
        *(u64 *)(r1 - 0x200) = 0
        r0 = 0
        exit""", "invalid stack access off=-520 size=8", 5),
    # bpf_loop: its callback returns 0 or 1 (Linux's verifier: "should have been in [0, 1]")
    Case("callback_returns_2", LOOP_NULL + "r0 = 2\nexit", "the callback returns 2: bpf_loop's callback returns 0", 9),
    Case("callback_returns_its_index", LOOP_NULL + "r0 = r1\nexit", "the callback returns scalar(umax=3", 9),
    Case("callback_returns_nothing", LOOP_NULL + "exit", "the callback returns nothing", 8),
    Case("callback_inside_a_function", "r1 = 4\nr3 = 0\n" + LOOP_CALL + "r0 = 0\ncb: exit",
         "the callback at 7 is no function's start: insn 6 before it runs into it (callback target)", 2),
    Case("callback_is_the_main_program", "r1 = 4\nr3 = 0\nr2 = func -0x3 ll\nr4 = 0\ncall loop\nr0 = 0\nexit",
         "the callback at 0 is the main program", 2),
    Case("loop_without_a_function", "r1 = 4\nr2 = 0\nr3 = 0\nr4 = 0\ncall loop\nr0 = 0\nexit",
         "r2 is scalar, loop needs a static function's address", 4),
    Case("function_address_arithmetic", "r2 = func cb ll\nr2 += 8\nr0 = 0\nexit\ncb: r0 = 0\nexit",
         "arithmetic on a function's address prohibited (r2 is func)", 2),
    Case("function_address_read", "r2 = func cb ll\nr0 = *(u64 *)(r2 + 0)\nexit\ncb: r0 = 0\nexit",
         "invalid mem access 'func'", 2),
    Case("function_address_compared", "r2 = func cb ll\nr0 = 0\nif r2 == 0 goto +1\nr0 = 1\nexit\ncb: r0 = 0\nexit",
         "comparison of a function's address prohibited", 3),
    Case("loop_ctx_maybe_null", LOOKUP_COUNTS + "r1 = 4\nr3 = r0\n" + LOOP_CALL + "r0 = 0\nexit\ncb: r0 = 0\nexit",
         "r3 is map_value_or_null, loop passes its callback a pointer to the stack or a map value", 11),
    # the index is below nr_loops: 3 rounds of 8 bytes overrun a 16-byte array
    Case("callback_index_past_the_array", """
        *(u64 *)(r10 - 8) = 0
        *(u64 *)(r10 - 16) = 0
        r1 = 3
        r3 = r10
        r3 += -16""" + LOOP_CALL + """
        r0 = *(u64 *)(r10 - 8)
        exit
    cb: r1 <<= 3
        r2 += r1
        *(u64 *)(r2 + 0) = 7
        r0 = 0
        exit""", "invalid stack access off=-16+[0, 16] size=8", 13),
    # the callback may run no round: what it would write the caller may not read
    Case("caller_reads_what_only_the_callback_writes", """
        r1 = 4
        r3 = r10
        r3 += -8""" + LOOP_CALL + """
        r0 = *(u64 *)(r10 - 8)
        exit
    cb: *(u64 *)(r2 + 0) = 1
        r0 = 0
        exit""", "invalid read from stack off=-8 size=8: not initialized", 7),
    # the callback's frame lies below its caller's in the combined stack
    Case("callback_frame_in_the_combined_stack", """
        *(u64 *)(r10 - 480) = 0
        r1 = 1
        r3 = 0""" + LOOP_CALL + """
        r0 = 0
        exit
    cb: *(u64 *)(r10 - 64) = 0
        r0 = 0
        exit""", "combined stack size of 2 calls is 544 (480 at pc 0, 64 at pc 9)", 3),
    # a round may overwrite the caller's spilled map value pointer with a number
    Case("callback_clobbers_a_spilled_pointer", LOOKUP_ARR + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r0
        r1 = 1
        r3 = r10
        r3 += -16""" + LOOP_CALL + """
        r1 = *(u64 *)(r10 - 16)
        r0 = *(u64 *)(r1 + 0)
        exit
    out: r0 = 0
        exit
    cb: *(u64 *)(r2 + 0) = 0
        r0 = 0
        exit""", "invalid mem access 'scalar'", 16),
)

ACCEPT: tuple[Case, ...] = (
    # bpf_loop: the callback sums its indices into the caller's stack, which reads the sum after the loop, and
    # stops after five rounds; the loop's result is a number
    Case("loop_sums_into_the_callers_stack", """
        *(u64 *)(r10 - 8) = 0
        r1 = 10
        r3 = r10
        r3 += -8""" + LOOP_CALL + """
        r1 = *(u64 *)(r10 - 8)
        r0 += r1
        exit
    cb: r3 = *(u64 *)(r2 + 0)
        r3 += r1
        *(u64 *)(r2 + 0) = r3
        r0 = 0
        if r1 < 4 goto +1
        r0 = 1
        exit"""),
    # each round makes the caller's u64 unknown and then branches: the second round meets the first's state at the
    # branch, a later round, not a loop (Linux's callback_unroll_depth tells them apart)
    Case("loop_rounds_meet_the_same_state", """
        *(u64 *)(r10 - 8) = 0
        r1 = 4
        r3 = r10
        r3 += -8""" + LOOP_CALL + """
        r0 = 0
        exit
    cb: r6 = r2
        call ktime_get_ns
        r1 = *(u64 *)(r6 + 0)
        r1 += r0
        *(u64 *)(r6 + 0) = r1
        r1 &= 1
        if r1 == 0 goto out
        r1 = map_value[4] + 0x0 ll
        r2 = 1
        lock *(u64 *)(r1 + 0x0) += r2
    out: r0 = 0
        exit"""),
    # a 32-bit compare bounds the low half of a 64-bit unknown (clang's `__u32 i = ...; if (i < 8) v[i]`): the
    # 32-bit move after it takes [0, 7] (the kernel's __reg_bound_offset)
    Case("jmp32_bounds_the_low_half_of_a_wide_unknown", """
        call get_prandom_u32
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        if w6 > 7 goto out
        w6 = w6
        r6 <<= 3
        r0 += r6
        r0 = *(u64 *)(r0 + 0)
    out: r0 = 0
        exit"""),
    # a bound that is no power of two: the low half's own bounds keep [0, 5] (Linux's u32 bounds), where its bits
    # alone would allow 7 and so offset 16 + 56, past the 64-byte value; taken by a 32-bit move, or a mask
    Case("jmp32_bound_kept_through_a_32bit_move", """
        call get_prandom_u32
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        if w6 > 5 goto out
        w1 = w6
        r1 <<= 3
        r0 += r1
        r0 = *(u64 *)(r0 + 16)
    out: r0 = 0
        exit"""),
    Case("jmp32_bound_kept_through_a_mask", """
        call get_prandom_u32
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        if w6 >= 6 goto out
        r1 = r6
        r1 &= 7
        r1 <<= 3
        r0 += r1
        r0 = *(u64 *)(r0 + 16)
    out: r0 = 0
        exit"""),
    # the low half's signed bounds (Linux's s32 bounds), from two signed 32-bit compares of a 64-bit unknown:
    # s> 50 first leaves [S32_MIN, 50], no unsigned range of the low half, which s< 0 then makes [0, 50]
    Case("jmp32_signed_bounds_in_either_order", SIGNED_LOW_HALF.format(hi=50) + """
        w6 = w6
        r0 += r6
        r0 = *(u8 *)(r0 + 10)
    out: r0 = 0
        exit"""),
    # clang's sign extension before -mcpu=v4: the low half moved up and back, its signed bounds with it
    Case("shift_pair_sign_extends_the_signed_low_half", SIGNED_LOW_HALF.format(hi=50) + """
        r6 <<= 32
        r6 s>>= 32
        r0 += r6
        r0 = *(u8 *)(r0 + 10)
    out: r0 = 0
        exit"""),
    Case("movsx_sign_extends_the_signed_low_half", SIGNED_LOW_HALF.format(hi=50) + """
        r6 = (s32)r6
        r0 += r6
        r0 = *(u8 *)(r0 + 10)
    out: r0 = 0
        exit"""),
    # a 32-bit add of a signed range that does not wrap as a signed number: [-10, 10] + 10 is [0, 20]
    Case("w_add_keeps_a_signed_range", """
        call ktime_get_ns
        r6 = r0""" + LOOKUP_ARR + """
        if r0 == 0 goto out
        if r6 s> 10 goto out
        if r6 s< -10 goto out
        w6 += 10
        r0 += r6
        r0 = *(u8 *)(r0 + 0)
    out: r0 = 0
        exit"""),
    # nr_loops read from a map value, the callback adding into that value through its ctx
    Case("loop_count_and_ctx_from_a_map_value", LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = *(u64 *)(r0 + 0)
        r3 = r0""" + LOOP_CALL + """
    out: r0 = 0
        exit
    cb: r3 = *(u64 *)(r2 + 8)
        r3 += r1
        *(u64 *)(r2 + 8) = r3
        r0 = 0
        exit"""),
    # the index bounds an index into the caller's 2-slot array
    Case("loop_index_into_an_array", """
        *(u64 *)(r10 - 8) = 0
        *(u64 *)(r10 - 16) = 0
        r1 = 2
        r3 = r10
        r3 += -16""" + LOOP_CALL + """
        r0 = *(u64 *)(r10 - 8)
        exit
    cb: r1 <<= 3
        r2 += r1
        *(u64 *)(r2 + 0) = 7
        r0 = 0
        exit"""),
    # a queue's pop fills its value, uninitialized before; the value read after
    Case("pop_fills_uninit_stack", """
        r2 = r10
        r2 += -8
        r1 = map[6] ll
        call map_pop_elem
        r0 = *(u64 *)(r10 - 8)
        exit""", gpu=False),
    # get_current_comm fills its buffer, uninitialized before: the bytes it wrote may be read after
    Case("comm_fills_uninit_stack", """
        r1 = r10
        r1 += -16
        r2 = 16
        call get_current_comm
        r0 = *(u64 *)(r10 - 8)
        exit"""),
    # Two pointers into one region ordered, signed or not (64 bits): a stack frame, the context, a ringbuf
    # record. The kernel allows it where pointers may leak (tracing); each back end lays these out alike.
    Case("pointer_ordering", "r9 = r1" + RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        r7 = r0
        r7 += 8
        if r6 >= r7 goto sub
        *(u64 *)(r6 + 0x0) = 0
    sub:
        if r7 s> r6 goto +0
        *(u64 *)(r6 + 0x8) = 0
        r8 = r10
        r8 += -8
        if r8 < r10 goto +0
        if r10 s>= r8 goto +0
        r5 = r9
        r5 += 8
        if r9 <= r5 goto +0
        if r5 s< r9 goto +0
        if r6 != r10 goto +0
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit"""),
    # Every atomic, 64 and 32 bits, on a ringbuf record (the kernel's PTR_TO_MEM)
    Case("ringbuf_atomics", RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        *(u64 *)(r6 + 0x0) = 0
        *(u64 *)(r6 + 0x8) = 0
        r1 = 1
        lock *(u64 *)(r6 + 0x0) += r1
        lock *(u32 *)(r6 + 0x8) |= w1
        lock *(u32 *)(r6 + 0xc) &= w1
        lock *(u64 *)(r6 + 0x8) ^= r1
        r1 = atomic_fetch_add((u64 *)(r6 + 0x0), r1)
        w1 = atomic_fetch_or((u32 *)(r6 + 0x8), w1)
        w1 = atomic_fetch_and((u32 *)(r6 + 0xc), w1)
        r1 = atomic_fetch_xor((u64 *)(r6 + 0x8), r1)
        r1 = xchg_64(r6 + 0x8, r1)
        w1 = xchg32_32(r6 + 0xc, w1)
        r0 = 5
        r0 = cmpxchg_64(r6 + 0x0, r0, r1)
        w0 = cmpxchg32_32(r6 + 0xc, w0, w1)
        r1 = r6
        r2 = 0
        call ringbuf_submit
    out:
        r0 = 0
        exit"""),
    # Two pointers compared for equality (clang's order for "a && b && a != b" of two lookups); the kernel
    # allows it where pointers may leak, as in every tracing program, and on a GPU no address leaks anywhere.
    Case("pointer_equality", LOOKUP_COUNTS + """
        r6 = r0
        r1 = map[0] ll
        r2 = r10
        r2 += -4
        call map_lookup_elem
        if r6 == r0 goto out
        if r6 == 0 goto out
        r1 = 1
        lock *(u64 *)(r6 + 0x0) += r1
    out:
        r0 = 0
        exit"""),
    Case("bounded_loop", """
        r1 = 0
        r2 = 0
    loop:
        r2 += r1
        r1 += 1
        if r1 < 100 goto loop
        r0 = r2
        exit"""),
    Case("loop_bound_from_rodata", """
        r1 = map_value[3] + 0x0 ll
        r2 = *(u32 *)(r1 + 0x0)
        r0 = 0
    loop:
        r0 += 3
        r2 += -1
        if r2 != 0 goto loop
        exit"""),
    # an array's value at a key known below max_entries is never NULL: Linux 6.14's can_elide_value_nullness
    Case("array_key_known_never_null", LOOKUP_ARR + """
        r1 = 1
        lock *(u64 *)(r0 + 0x38) += r1
        if r0 == 0 goto out
        r0 = *(u64 *)(r0 + 0x0)
    out:
        exit"""),
    Case("null_check_eq", LOOKUP_COUNTS + """
        if r0 == 0 goto out
        r1 = 1
        lock *(u64 *)(r0 + 0x0) += r1
    out:
        r0 = 0
        exit"""),
    Case("null_check_ne_and_copy", LOOKUP_COUNTS + """
        r6 = r0
        if r0 != 0 goto found
        r0 = 0
        exit
    found:
        r0 = *(u64 *)(r6 + 0x0)
        exit"""),
    Case("checked_index_into_map_value", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = *(u32 *)(r6 + 0x1c)
        if r1 > 15 goto out
        r1 <<= 2
        r0 += r1
        r0 = *(u32 *)(r0 + 0x0)
    out:
        r0 = 0
        exit"""),
    Case("jmp32_bounds", """
        r6 = r1
    """ + LOOKUP_ARR + """
        if r0 == 0 goto out
        w1 = *(u32 *)(r6 + 0x1c)
        if w1 > 7 goto out
        r1 <<= 3
        r0 += r1
        r0 = *(u64 *)(r0 + 0x0)
    out:
        r0 = 0
        exit"""),
    Case("signed_jmp32_bounds", """
        r6 = r1
    """ + LOOKUP_ARR + """
        if r0 == 0 goto out
        w1 = *(u32 *)(r6 + 0x1c)
        if w1 s< 0 goto out
        if w1 s> 63 goto out
        r0 += r1
        r0 = *(u8 *)(r0 + 0x0)
    out:
        r0 = 0
        exit"""),
    Case("linked_scalar_copies", """
        r6 = r1
    """ + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = *(u32 *)(r6 + 0x1c)
        r2 = r1
        if r2 > 63 goto out
        r0 += r1
        r0 = *(u8 *)(r0 + 0x0)
    out:
        r0 = 0
        exit"""),
    Case("spill_and_fill_map_value", LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r0
        call ktime_get_ns
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r1 + 0x0) = r0
    out:
        r0 = 0
        exit"""),
    Case("spill_or_null_then_check_fill", LOOKUP_COUNTS + """
        *(u64 *)(r10 - 16) = r0
        if r0 == 0 goto out
        r1 = *(u64 *)(r10 - 16)
        r0 = *(u64 *)(r1 + 0x0)
        exit
    out:
        r1 = *(u64 *)(r10 - 16)
        r0 = r1
        exit"""),
    Case("ringbuf_submit_or_discard", RESERVE + """
        if r0 == 0 goto out
        r6 = r0
        call ktime_get_ns
        *(u64 *)(r6 + 0x8) = r0
        r1 = r6
        r2 = 0
        if r0 > 100 goto discard
        call ringbuf_submit
        goto out
    discard:
        call ringbuf_discard
    out:
        r0 = 0
        exit"""),
    Case("subprogram_with_stack_args", """
        *(u64 *)(r10 - 8) = 7
        r1 = r10
        r1 += -8
        r2 = 3
        call local sub
        r0 += 1
        exit
    sub:
        r3 = *(u64 *)(r1 + 0x0)
        *(u64 *)(r10 - 8) = r3
        r0 = *(u64 *)(r10 - 8)
        r0 += r2
        *(u64 *)(r1 + 0x0) = r0
        exit"""),
    Case("variable_offset_after_bounds_check", LOOKUP_ARR + """
        r6 = r0
        r0 = 0
        if r6 == 0 goto out
        call get_smp_processor_id
        r0 &= 63
        r6 += r0
        r0 = *(u8 *)(r6 + 0x0)
    out:
        exit"""),
    Case("variable_offset_stack_read", """
        *(u64 *)(r10 - 8) = 0
        *(u64 *)(r10 - 16) = 0
        call get_smp_processor_id
        r0 &= 15
        r1 = r10
        r1 += -16
        r1 += r0
        r0 = *(u8 *)(r1 + 0x0)
        exit"""),
    Case("xchg_cmpxchg_on_map_value", LOOKUP_COUNTS + """
        if r0 == 0 goto out
        r1 = r0
        r2 = 5
        r2 = xchg_64(r1 + 0x0, r2)
        r0 = 5
        r3 = 6
        r0 = cmpxchg_64(r1 + 0x0, r0, r3)
        w3 = 1
        w3 = atomic_fetch_add((u32 *)(r1 + 0x4), w3)
    out:
        r0 = 0
        exit"""),
    Case("atomic_on_stack", """
        *(u64 *)(r10 - 8) = 0
        r1 = 2
        lock *(u64 *)(r10 - 0x8) += r1
        r0 = *(u64 *)(r10 - 8)
        exit"""),
    Case("u32_spill_keeps_bounds", "r6 = r1" + LOOKUP_ARR + """
        if r0 == 0 goto out
        r7 = r0
        w1 = *(u32 *)(r6 + 0x1c)
        if w1 > 63 goto out
        *(u32 *)(r10 - 8) = w1
        call get_lane_id
        w1 = *(u32 *)(r10 - 8)
        r7 += r1
        r0 = *(u8 *)(r7 + 0x0)
        exit
    out:
        r0 = 0
        exit"""),
    Case("printk_variadic_leftovers", """
        *(u64 *)(r10 - 8) = 0
        r1 = r10
        r1 += -8
        r2 = 8
        r4 = r10
        call trace_printk
        r0 = 0
        exit"""),
    Case("division_by_zero_is_defined", "r0 = 10\nr1 = 0\nr0 /= r1\nr2 = 7\nr2 %= r1\nw0 /= w1\nexit"),
    Case("bss_global_write", """
        r1 = map_value[4] + 0x8 ll
        r2 = 1
        lock *(u64 *)(r1 + 0x0) += r2
        *(u32 *)(r1 - 0x8) = 3
        r0 = *(u32 *)(r1 - 0x4)
        exit"""),
    Case("perf_event_output_from_stack", "*(u64 *)(r10 - 8) = 0" + PERF_OUTPUT.format(n=8)),
    # a record struct's padding (u32 then u64: bytes 4-7 never written) goes out as the stack held it, as Linux's
    # privileged programs send it; a key's would not pass (helper_key_padding)
    Case("perf_event_output_of_a_padded_struct",
         "*(u32 *)(r10 - 16) = 7\n*(u64 *)(r10 - 8) = 0" + PERF_OUTPUT.format(n=16)),
    Case("update_of_a_padded_value", """
        *(u32 *)(r10 - 68) = 3
        *(u32 *)(r10 - 64) = 7
        *(u64 *)(r10 - 8) = 9
        r2 = r10
        r2 += -68
        r3 = r10
        r3 += -64
        r1 = map[1] ll
        r4 = 0
        call map_update_elem
        r0 = 0
        exit"""),
    Case("ringbuf_output_of_a_padded_struct", """
        *(u32 *)(r10 - 16) = 7
        *(u64 *)(r10 - 8) = 0
        r2 = r10
        r2 += -16
        r1 = map[2] ll
        r3 = 16
        r4 = 0
        call ringbuf_output
        r0 = 0
        exit"""),
    Case("gpu_helpers_u64_out", """
        r1 = r10
        r1 += -8
        r2 = r10
        r2 += -16
        r3 = r10
        r3 += -24
        call get_thread_idx
        r0 = *(u64 *)(r10 - 8)
        r1 = *(u64 *)(r10 - 24)
        r0 += r1
        exit"""),
    Case("printk_bounded_size", """
        *(u64 *)(r10 - 16) = 0
        *(u64 *)(r10 - 8) = 0
        call get_lane_id
        r2 = r0
        if r2 > 16 goto out
        r1 = r10
        r1 += -16
        r3 = 0
        call trace_printk
    out:
        r0 = 0
        exit"""),
    Case("two_lookups_path_sensitive", """
        r6 = r1
    """ + LOOKUP_COUNTS + """
        r7 = r0
    """ + LOOKUP_ARR + """
        if r7 == 0 goto out
        if r0 == 0 goto out
        r1 = *(u64 *)(r7 + 0x0)
        *(u64 *)(r0 + 0x38) = r1
    out:
        r0 = 0
        exit"""),
    Case("bpf_exit_after_submit", RESERVE + """
        if r0 == 0 goto out
        r1 = r0
        r2 = 0
        call ringbuf_submit
        call exit
    out:
        r0 = 0
        exit"""),
    Case("spilled_pointer_replaced_whole", "r6 = r1" + LOOKUP_COUNTS + """
        if r0 == 0 goto out
        *(u64 *)(r10 - 16) = r10
        *(u64 *)(r10 - 16) = 7
        r7 = r0
        r1 = r10
        r1 += -16
        r2 = r1
        r3 = r1
        call get_block_idx
        r1 = *(u64 *)(r10 - 16)
        *(u64 *)(r7 + 0x0) = r1
    out:
        r0 = 0
        exit"""),
    Case("subprogram_result_unused", "call local sub\nr0 = 0\nexit\nsub:\nexit"),
    Case("w32_copy_minus_one_bounds_the_original", PRINTK_BUF + """
        w2 = *(u32 *)(r6 + 0x1c)
        w3 = w2
        w3 += -1
        if w3 > 31 goto out
        r1 = r10
        r1 += -32
        call trace_printk
    out:
        r0 = 0
        exit"""),
    Case("copy_plus_constants_bounds_the_original", PRINTK_BUF + """
        r2 = *(u64 *)(r6 + 0x0)
        r3 = r2
        r3 += 5
        r4 = r3
        r4 += -6
        *(u64 *)(r10 - 40) = r4
        r5 = *(u64 *)(r10 - 40)
        if r5 > 31 goto out
        r1 = r10
        r1 += -32
        call trace_printk
    out:
        r0 = 0
        exit"""),
    Case("pointer_difference", """
        r1 = r10
        r1 += -8
        r2 = r10
        r2 += -24
        r1 -= r2
        *(u64 *)(r10 - 16) = 0
        r2 += r1
        r0 = *(u64 *)(r2 - 0x8)
        exit"""),
    Case("signed_load_and_movsx_bounds", """
        r6 = r1
    """ + LOOKUP_ARR + """
        if r0 == 0 goto out
        r1 = *(s8 *)(r6 + 0x1c)
        if r1 s< 0 goto out
        if r1 s> 63 goto out
        r0 += r1
        r0 = *(u8 *)(r0 + 0x0)
    out:
        r0 = 0
        exit"""),
)


# A hash map with the given map_flags and a program that looks key 0 up, then runs body with v non-null.
ACCESS_FLAGS = r"""#include "egpu.bpf.h"
struct {{ __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 4); __type(key, __u64); __type(value, __u64);
	 __uint(map_flags, {flags}); }} m SEC(".maps");
SEC("kprobe/*")
int p(struct egpu_ctx *ctx)
{{
	__u64 k = 0, *v = bpf_map_lookup_elem(&m, &k);
	if (!v)
		return 0;
	{body}
	return 0;
}}
char LICENSE[] SEC("license") = "GPL";
"""


# C probes clang turns into what the verifier must follow: loops bounded by a constant, by a value from
# ctx and by .rodata, variable indices into map values and stack arrays, alu32 spills, a static
# subprogram taking a stack array, ringbuf submit/discard, printk with leftover registers, u64_out; and
# (issue 20) a subprogram result clang drops, a length bounded through a copy.
C_PROBES = {
    "tricky": r"""#include "egpu.bpf.h"

struct val { __u64 count; __u64 sum; __u32 hist[16]; };
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1024); __type(key, __u64); __type(value, struct val); }
    stats SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, __u64); }
    per_sm SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } rb SEC(".maps");

const volatile __u32 nbuckets = 12;
__u64 total = 0;

static __always_inline __u32 log2u(__u64 v)
{
	__u32 r = 0;
#pragma clang loop unroll(disable)
	for (int i = 0; i < 63; i++) {
		if (v <= 1)
			break;
		v >>= 1;
		r++;
	}
	return r;
}

static __noinline __u64 mix(__u64 *arr, int n)
{
	__u64 h = 0;
#pragma clang loop unroll(disable)
	for (int i = 0; i < n && i < 8; i++)
		h = h * 31 + arr[i];
	return h;
}

SEC("egpu/mem/*")
int tricky(struct egpu_ctx *ctx)
{
	__u64 key = ctx->kernel_id;
	struct val zero = {};
	struct val *v = bpf_map_lookup_elem(&stats, &key);
	if (!v) {
		bpf_map_update_elem(&stats, &key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&stats, &key);
		if (!v)
			return 0;
	}
	__sync_fetch_and_add(&v->count, 1);
	__sync_fetch_and_add(&v->sum, ctx->size);
	__u32 b = log2u(ctx->size);
	if (b >= nbuckets)
		b = nbuckets - 1;
	if (b < 16)
		__sync_fetch_and_add(&v->hist[b], 1);

	__u64 arr[8];
	int n = ctx->nargs;
#pragma clang loop unroll(disable)
	for (int i = 0; i < 8; i++)
		arr[i] = ctx->args[i];
	__u64 h = mix(arr, n);

	__u32 sm = bpf_get_smp_processor_id() & 63;
	__u64 *c = bpf_map_lookup_elem(&per_sm, &sm);
	if (c)
		*c += h & 1;

	struct { __u64 a; __u32 b; __u32 c; } *e = bpf_ringbuf_reserve(&rb, 16, 0);
	if (e) {
		e->a = h;
		e->b = b;
		e->c = ctx->site;
		if (h & 1)
			bpf_ringbuf_discard(e, 0);
		else
			bpf_ringbuf_submit(e, 0);
	}
	total += 1;
	switch (ctx->flags) {
	case 1: return 3;
	case 2: return 5;
	case 4: return 9;
	default: return 0;
	}
}
char LICENSE[] SEC("license") = "GPL";
""",
    "var_loops": r"""#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64[32]); }
    tab SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY); __uint(key_size, 4); __uint(value_size, 4); } perf SEC(".maps");

SEC("kprobe/*")
int var_loops(struct egpu_ctx *ctx)
{
	__u32 zero = 0;
	__u64 *t = bpf_map_lookup_elem(&tab, &zero);
	if (!t)
		return 0;
	__u32 n = ctx->nargs;
	__u64 acc = 0;
	__u8 buf[32] = {};
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < n && i < 32; i++) {
		acc += t[i];
		buf[i] = (__u8)acc;
	}
	__u32 idx = ctx->site;
	if (idx < 32)
		t[idx] += buf[idx & 31];
	char msg[] = "hello %llu";
	bpf_trace_printk(msg, sizeof(msg), acc);
	bpf_perf_event_output(ctx, &perf, BPF_F_CURRENT_CPU, buf, sizeof(buf));
	__u64 tid[3];
	bpf_get_thread_idx(&tid[0], &tid[1], &tid[2]);
	return tid[0] + tid[1] + tid[2] > 5;
}
char LICENSE[] SEC("license") = "GPL";
""",
    "precision": r"""/* Legal C once refused (issue 20, item 8): a subprogram's result clang drops, and a length
 * whose bounds clang tests on a copy. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} sizes SEC(".maps");

/* The caller ignores the result, so clang leaves r0 unset on the path that adds. */
static __noinline int note(__u64 *v, __u32 by)
{
	if (!v)
		return 0;
	__sync_fetch_and_add(v, by);
	return 1;
}

SEC("kprobe/*")
int dropped_result(struct egpu_ctx *ctx)
{
	__u32 k = 0;

	note(bpf_map_lookup_elem(&sizes, &k), ctx->size);
	return 0;
}

/* clang tests n - 1 <= 31 on a copy of n: the bound reaches n only through the link between them. */
SEC("kprobe/*")
int printk_len(struct egpu_ctx *ctx)
{
	char buf[32] = "site %d\n";
	__u32 n = ctx->size;

	if (n > 0 && n <= 32)
		bpf_trace_printk(buf, n, ctx->site);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
""",
    "low_half_bounds": r"""/* A u32 taken from a 64-bit value and bounded below a power of two: clang compares the w
 * register, then masks or moves it, and only the low half's own bounds (Linux's u32 bounds) keep each index
 * inside hist[10]. */
#include "egpu.bpf.h"

struct val { __u64 hist[10]; __u64 other; };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct val);
} m SEC(".maps");

SEC("kprobe/*")
int buckets(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	struct val *v = bpf_map_lookup_elem(&m, &k);

	if (!v)
		return 0;
	__u64 t = bpf_ktime_get_ns();
	__u32 i = t;
	if (i < 10)
		v->hist[i]++;
	__u32 j = (t >> 7) % 11;
	if (j < 10)
		__sync_fetch_and_add(&v->hist[j], 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
""",
    "signed_clamps": r"""/* An int clamped or range-checked upper bound first: clang compares the w register
 * signed, and only the low half's signed bounds (Linux's s32 bounds) keep each index inside hist[64]. */
#include "egpu.bpf.h"

struct val { __u64 hist[64]; __s64 sum; };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct val);
} m SEC(".maps");

SEC("kprobe/*")
int clamp(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	struct val *v = bpf_map_lookup_elem(&m, &k);

	if (!v)
		return 0;
	int d = (int)bpf_ktime_get_ns();
	if (d > 63)
		d = 63;
	if (d < 0)
		d = 0;
	v->hist[d]++;
	return 0;
}

SEC("kprobe/*")
int checked(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	struct val *v = bpf_map_lookup_elem(&m, &k);

	if (!v)
		return 0;
	int i = (int)bpf_ktime_get_ns();
	if (i > 50)
		return 0;
	v->sum += 1;
	if (i < 0)
		return 0;
	v->hist[i]++;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
""",
    "min_max_over_a_map": r"""/* Min, max and a count of nonzero values over 40 lookups, in registers: the states that
 * cover later rounds are old ones, refused as too complex while each point compared only its 16 newest
 * (verifier/__init__.py keeps a state while it covers, as the kernel does). */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 40);
	__type(key, __u32);
	__type(value, __u64);
} per_sm SEC(".maps");

struct mm { __u64 mn, mx, nz; };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mm);
} out SEC(".maps");

SEC("kretprobe.block/*")
int spread(struct egpu_ctx *ctx)
{
	__u64 mn = ~0ULL, mx = 0, nz = 0;

	for (__u32 i = 0; i < 40; i++) {
		__u32 k = i;
		__u64 *v = bpf_map_lookup_elem(&per_sm, &k);

		if (!v)
			continue;
		__u64 x = *v;
		if (x < mn)
			mn = x;
		if (x > mx)
			mx = x;
		if (x)
			nz++;
	}
	__u32 z = 0;
	struct mm *o = bpf_map_lookup_elem(&out, &z);
	if (o) {
		o->mn = mn;
		o->mx = mx;
		o->nz = nz;
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
""",
    "counts_over_a_map": r"""/* Counts kept in registers over 512 lookups: refused as too complex until pruning left out
 * what no check reads (verifier/precision.py); the loop's index, which bounds it and keys the lookup, stays
 * exact. */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, __u64);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} out SEC(".maps");

SEC("kretprobe/*")
int hot_slots(struct egpu_ctx *ctx)
{
	__u64 hot = 0, cold = 0;

	for (__u32 i = 0; i < 512; i++) {
		__u64 *v = bpf_map_lookup_elem(&slots, &i);

		if (v && *v > 100)
			hot++;
		else if (v && *v == 0)
			cold++;
	}
	__u32 k = 0;
	__u64 *o = bpf_map_lookup_elem(&out, &k);
	if (o)
		*o = hot;
	k = 1;
	o = bpf_map_lookup_elem(&out, &k);
	if (o)
		*o = cold;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
""",
    "map_by_path": r"""/* One helper call, a map chosen per path: Linux accepts it (the call site's map pointer is
 * poisoned and the map's own ops run); the translator refused it, "r1 is not a map known at translation time". */
#include "egpu.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} loads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} stores SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} atomics SEC(".maps");

struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } rb_small SEC(".maps"), rb_big SEC(".maps");

SEC("egpu/mem/*")
int by_kind(struct egpu_ctx *ctx)
{
	void *m = ctx->flags & EGPU_F_ATOMIC ? (void *)&atomics : ctx->flags & EGPU_F_STORE ? (void *)&stores
										  : (void *)&loads;
	__u32 k = ctx->site & 63;
	__u64 sz = ctx->size, *v = bpf_map_lookup_elem(m, &k);

	if (v)
		__sync_fetch_and_add(v, sz);
	else
		bpf_map_update_elem(m, &k, &sz, BPF_NOEXIST);
	bpf_ringbuf_output(sz > 8 ? (void *)&rb_big : (void *)&rb_small, &sz, sizeof(sz), 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
""",
    # a read-only map's values are read, a write-only map's written, looked up, updated and deleted (Linux too)
    "rdonly_prog": ACCESS_FLAGS.format(flags="BPF_F_RDONLY_PROG", body="return *v;"),
    "wronly_prog": ACCESS_FLAGS.format(flags="BPF_F_WRONLY_PROG", body="*v = ctx->site;\n\tbpf_map_update_elem(&m, "
                                       "&k, &k, BPF_ANY);\n\tbpf_map_delete_elem(&m, &k);"),
}


# C probes the verifier must refuse (issue 20), each with a substring of the reason.
C_REFUSED = {
    # "a < b ? a : b" over two lookups: the VM orders two values by first lookup (a region each), the C engine
    # and the GPU by key (one region per map), so here the VM would pick slot 1 and the others slot 0
    "order_of_two_values": (r"""#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64); }
    slots SEC(".maps");
SEC("kprobe/*")
int lower_slot(struct egpu_ctx *ctx)
{
	__u32 k1 = (ctx->site & 3) | 1, k0 = 0;
	__u64 *b = bpf_map_lookup_elem(&slots, &k1);
	__u64 *a = bpf_map_lookup_elem(&slots, &k0);
	if (!a || !b)
		return 0;
	__sync_fetch_and_add(a < b ? a : b, 1);
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
""", "an order between two regions differs between the VM and the GPU"),
    # bpf_exit() ends the probe with the record still reserved: on the GPU the ring stops delivering
    "exit_holding_a_record": (r"""#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } rb SEC(".maps");
SEC("kprobe/*")
int exit_holding(struct egpu_ctx *ctx)
{
	__u64 *e = bpf_ringbuf_reserve(&rb, 8, 0);
	if (!e)
		return 0;
	*e = ctx->site;
	if (ctx->site & 1)
		bpf_exit();
	bpf_ringbuf_submit(e, 0);
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
""", "submit or discard it before bpf_exit()"),
    # a million rounds, each leaving the "value arrived" branch behind: refused in thousands of rounds
    "wait_on_a_map_value": (r"""#include "egpu.bpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64); }
    flag SEC(".maps");
SEC("kprobe/*")
int wait_flag(struct egpu_ctx *ctx)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&flag, &k);
	if (!v)
		return 0;
	for (int i = 0; i < 1000000; i++)
		if (*(volatile __u64 *)v)
			break;
	return 0;
}
char LICENSE[] SEC("license") = "GPL";
""", "the sequence of 8193 jumps is too complex"),
    # BPF_F_RDONLY_PROG and BPF_F_WRONLY_PROG bind programs as Linux's bpf_map_flags_to_cap and
    # record_func_map do: no store, atomic, update or delete into a read-only map, no read of a write-only
    # map's value (its lookup itself is allowed: "wronly_prog" in C_PROBES)
    "store_into_rdonly_prog": (ACCESS_FLAGS.format(flags="BPF_F_RDONLY_PROG", body="*v = ctx->site;"),
                               "write into read-only map m"),
    "atomic_on_rdonly_prog": (ACCESS_FLAGS.format(flags="BPF_F_RDONLY_PROG", body="__sync_fetch_and_add(v, 1);"),
                              "write into read-only map m"),
    "update_rdonly_prog": (ACCESS_FLAGS.format(flags="BPF_F_RDONLY_PROG",
                                               body="bpf_map_update_elem(&m, &k, &k, BPF_ANY);"),
                           "write into read-only map m (map_update_elem)"),
    "read_wronly_prog": (ACCESS_FLAGS.format(flags="BPF_F_WRONLY_PROG", body="return *v;"),
                         "read from write-only map m"),
    "atomic_on_wronly_prog": (ACCESS_FLAGS.format(flags="BPF_F_WRONLY_PROG", body="__sync_fetch_and_add(v, 1);"),
                              "read from write-only map m"),
    "helper_reads_wronly_prog": (ACCESS_FLAGS.format(flags="BPF_F_WRONLY_PROG",
                                                     body="bpf_map_update_elem(&m, &k, v, BPF_ANY);"),
                                 "read from write-only map m"),
}
