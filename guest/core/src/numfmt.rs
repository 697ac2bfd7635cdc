//! Integers as text without `core::fmt`, for the guest's boot lines: each
//! kernel instruction is emulated on software-KVM hosts, and `core::fmt`
//! costs hundreds of them per formatted line. The output is exactly that of
//! `{}` and `{:#x}` (unit tests compare them).

/// `v` in decimal, as `{}` writes it: the digits at the end of `buf`.
pub fn format_dec(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
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
            u64::MAX,
            u64::MAX - 1
        ];
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((1..20).map(|e| 10u64.pow(e) - 1));
        values.extend((1..20).map(|e| 10u64.pow(e)));
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
