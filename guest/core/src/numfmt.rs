//! Integers as text without `core::fmt`, for the guest's boot lines: each
//! kernel instruction is emulated on software-KVM hosts, and `core::fmt`
//! costs hundreds of them per formatted line. The output is exactly that of
//! `{}` and `{:#x}` (unit tests compare them).

/// "00" to "99": [`format_dec`] writes two digits per division.
const DEC_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// `v` in decimal, as `{}` writes it: the digits at the end of `buf`, two
/// per step (half the divisions of digit by digit: each instruction is
/// emulated on software-KVM hosts).
pub fn format_dec(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    while v >= 100 {
        let r = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DEC_PAIRS[r..r + 2]);
    }
    if v >= 10 {
        let r = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DEC_PAIRS[r..r + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    &buf[i..]
}

/// `v` in lower-case hexadecimal with `0x`, as `{:#x}` writes it.
pub fn format_hex(mut v: u64, buf: &mut [u8; 18]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    buf[i - 2..i].copy_from_slice(b"0x");
    &buf[i - 2..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn same_text_as_core_fmt() {
        let mut values = std::vec![
            0u64,
            1,
            9,
            10,
            15,
            16,
            99,
            100,
            0x7fff000,
            0x13d000,
            0xab,
            0x100,
            0x1ff,
            130684,
            u64::MAX,
            u64::MAX - 1
        ];
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((1..20).map(|e| 10u64.pow(e) - 1));
        values.extend((1..20).map(|e| 10u64.pow(e)));
        values.extend((0..5000).map(|i| i * 7919 + (i << 40)));
        for v in values {
            let (mut d, mut h) = ([0; 20], [0; 18]);
            assert_eq!(format_dec(v, &mut d), format!("{v}").as_bytes(), "{v}");
            assert_eq!(
                format_hex(v, &mut h),
                format!("{v:#x}").as_bytes(),
                "{v:#x}"
            );
        }
    }
}
