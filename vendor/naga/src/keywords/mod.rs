/*!
Lists of reserved keywords for each shading language with a [frontend][crate::front] or [backend][crate::back].
*/

#[cfg(any(feature = "wgsl-in", wgsl_out))]
pub mod wgsl;
