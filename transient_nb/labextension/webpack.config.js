// Extra build settings that @jupyter/builder merges into its own (package.json's
// "jupyterlab.webpackConfig"). The bundle embeds the panel's stylesheet as a string: minified by
// the builder's own lightningcss (rspack's built-in loader), not a second verbatim copy of
// style/base.css. Its rule runs before the builder's style-loader and css-loader.
module.exports = {
  module: {
    rules: [
      {
        test: /(?<!\.raw)\.css$/,
        use: [
          { loader: 'builtin:lightningcss-loader', options: { minify: true } }
        ]
      }
    ]
  }
};
