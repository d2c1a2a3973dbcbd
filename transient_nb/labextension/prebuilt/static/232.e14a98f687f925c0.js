"use strict";(self.rspackChunktransient_nb=self.rspackChunktransient_nb||[]).push([[232],{160(t,e,r){var n=r(62),o=r.n(n),a=r(151),i=(r.n(a))()(o());i.push([t.id,`/*
 * The "Transient clusters" side panel. JupyterLab's theme variables only, so that light, dark
 * and high-contrast themes work without more rules.
 */

.tnb-Sidebar {
  display: flex;
  flex-direction: column;
  overflow: hidden auto;
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
  font-size: var(--jp-ui-font-size1);
}

.tnb-Sidebar.tnb-mod-busy {
  cursor: progress;
}

.tnb-Header {
  display: flex;
  align-items: center;
  justify-content: space-between;
  padding: 8px 12px;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color2);
}

.tnb-Title {
  margin: 0;
  font-size: var(--jp-ui-font-size1);
  font-weight: 600;
  text-transform: uppercase;
}

.tnb-Message {
  padding: 6px 12px;
  color: var(--jp-warn-color0);
}

.tnb-Empty {
  padding: 12px;
}

.tnb-Hint {
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
}

.tnb-Cluster {
  padding: 8px 10px;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color2);
}

.tnb-Cluster > div {
  margin: 3px 0;
}

.tnb-Cluster.tnb-mod-stale,
.tnb-Cluster.tnb-mod-unreachable {
  opacity: 0.7;
}

.tnb-ClusterHead {
  display: flex;
  flex-wrap: wrap;
  align-items: baseline;
  gap: 6px;
}

.tnb-ClusterName {
  font-weight: 600;
  font-size: var(--jp-ui-font-size2);
}

.tnb-Badge {
  padding: 0 5px;
  border-radius: 8px;
  font-size: var(--jp-ui-font-size0);
  background: var(--jp-layout-color3);
}

.tnb-Badge.tnb-mod-running {
  background: var(--jp-success-color2);
  color: var(--jp-ui-inverse-font-color1);
}

.tnb-Badge.tnb-mod-stale,
.tnb-Badge.tnb-mod-unreachable {
  background: var(--jp-warn-color2);
}

.tnb-Backend {
  color: var(--jp-ui-font-color2);
}

.tnb-Dashboard {
  margin-left: auto;
  color: var(--jp-content-link-color);
}

.tnb-Placement,
.tnb-Counts {
  color: var(--jp-ui-font-color2);
}

.tnb-Cost {
  display: flex;
  flex-wrap: wrap;
  gap: 8px;
}

.tnb-Spent {
  font-weight: 600;
}

.tnb-Saved {
  color: var(--jp-success-color1);
}

.tnb-Error {
  color: var(--jp-error-color1);
}

.tnb-Workers {
  margin: 6px 0;
}

/* name | state | action on the first line, GPU, spot and zone across the second. */
.tnb-Worker {
  display: grid;
  grid-template-columns: 1fr auto auto;
  column-gap: 6px;
  align-items: center;
  padding: 2px 0;
  border-top: var(--jp-border-width) solid var(--jp-border-color3);
}

.tnb-WorkerName {
  font-weight: 600;
}

.tnb-WorkerState {
  white-space: nowrap;
}

.tnb-WorkerAction {
  min-height: 18px;
}

.tnb-WorkerInfo {
  grid-column: 1 / -1;
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
}

.tnb-Gone {
  margin-top: 2px;
}

.tnb-GoneLine {
  cursor: pointer;
  color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0);
}

.tnb-Worker.tnb-mod-gone {
  color: var(--jp-ui-font-color3);
}

.tnb-Worker.tnb-mod-gone .tnb-WorkerName {
  text-decoration: line-through;
}

.tnb-Worker.tnb-mod-notice .tnb-WorkerState {
  color: var(--jp-warn-color1);
}

.tnb-Worker.tnb-mod-joined .tnb-WorkerState {
  color: var(--jp-success-color1);
}

.tnb-Sidebar button.jp-mod-styled {
  height: 22px;
  padding: 0 5px;
  line-height: 20px;
  font-size: var(--jp-ui-font-size1);
  white-space: nowrap;
}

.tnb-Sidebar .tnb-PreemptButton.jp-mod-styled {
  height: 18px;
  padding: 0 5px;
  line-height: 16px;
  font-size: var(--jp-ui-font-size0);
}

.tnb-Actions {
  display: flex;
  flex-wrap: wrap;
  gap: 4px;
  margin-top: 6px;
}

.tnb-NewClusterForm {
  display: flex;
  flex-direction: column;
  gap: 6px;
  min-width: 300px;
}

.tnb-Field {
  display: flex;
  align-items: center;
  justify-content: space-between;
  gap: 12px;
}

.tnb-Field > input.jp-mod-styled,
.tnb-Field > select.jp-mod-styled {
  box-sizing: border-box;
  flex: 0 0 180px;
  width: 180px;
}
`,""]),r.d(e,{},{A:i})},151(t){t.exports=function(t){var e=[];return e.toString=function(){return this.map(function(e){var r="",n=void 0!==e[5];return e[4]&&(r+="@supports (".concat(e[4],") {")),e[2]&&(r+="@media ".concat(e[2]," {")),n&&(r+="@layer".concat(e[5].length>0?" ".concat(e[5]):""," {")),r+=t(e),n&&(r+="}"),e[2]&&(r+="}"),e[4]&&(r+="}"),r}).join("")},e.i=function(t,r,n,o,a){"string"==typeof t&&(t=[[null,t,void 0]]);var i={};if(n)for(var s=0;s<this.length;s++){var p=this[s][0];null!=p&&(i[p]=!0)}for(var c=0;c<t.length;c++){var l=[].concat(t[c]);n&&i[l[0]]||(void 0!==a&&(void 0===l[5]||(l[1]="@layer".concat(l[5].length>0?" ".concat(l[5]):""," {").concat(l[1],"}")),l[5]=a),r&&(l[2]&&(l[1]="@media ".concat(l[2]," {").concat(l[1],"}")),l[2]=r),o&&(l[4]?(l[1]="@supports (".concat(l[4],") {").concat(l[1],"}"),l[4]=o):l[4]="".concat(o)),e.push(l))}},e}},62(t){t.exports=function(t){return t[1]}},647(t){var e=[];function r(t){for(var r=-1,n=0;n<e.length;n++)if(e[n].identifier===t){r=n;break}return r}function n(t,n){for(var o={},a=[],i=0;i<t.length;i++){var s=t[i],p=n.base?s[0]+n.base:s[0],c=o[p]||0,l="".concat(p," ").concat(c);o[p]=c+1;var d=r(l),u={css:s[1],media:s[2],sourceMap:s[3],supports:s[4],layer:s[5]};if(-1!==d)e[d].references++,e[d].updater(u);else{var b=function(t,e){var r=e.domAPI(e);return r.update(t),function(e){e?(e.css!==t.css||e.media!==t.media||e.sourceMap!==t.sourceMap||e.supports!==t.supports||e.layer!==t.layer)&&r.update(t=e):r.remove()}}(u,n);n.byIndex=i,e.splice(i,0,{identifier:l,updater:b,references:1})}a.push(l)}return a}t.exports=function(t,o){var a=n(t=t||[],o=o||{});return function(t){t=t||[];for(var i=0;i<a.length;i++){var s=r(a[i]);e[s].references--}for(var p=n(t,o),c=0;c<a.length;c++){var l=r(a[c]);0===e[l].references&&(e[l].updater(),e.splice(l,1))}a=p}}},648(t){var e={};t.exports=function(t,r){var n=function(t){if(void 0===e[t]){var r=document.querySelector(t);if(window.HTMLIFrameElement&&r instanceof window.HTMLIFrameElement)try{r=r.contentDocument.head}catch(t){r=null}e[t]=r}return e[t]}(t);if(!n)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");n.appendChild(r)}},115(t){t.exports=function(t){var e=document.createElement("style");return t.setAttributes(e,t.attributes),t.insert(e,t.options),e}},279(t,e,r){t.exports=function(t){var e=r.nc;e&&t.setAttribute("nonce",e)}},564(t){t.exports=function(t){if("u"<typeof document)return{update:function(){},remove:function(){}};var e=t.insertStyleElement(t);return{update:function(r){var n,o,a;n="",r.supports&&(n+="@supports (".concat(r.supports,") {")),r.media&&(n+="@media ".concat(r.media," {")),(o=void 0!==r.layer)&&(n+="@layer".concat(r.layer.length>0?" ".concat(r.layer):""," {")),n+=r.css,o&&(n+="}"),r.media&&(n+="}"),r.supports&&(n+="}"),(a=r.sourceMap)&&"u">typeof btoa&&(n+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),t.styleTagTransform(n,e,t.options)},remove:function(){var t;null===(t=e).parentNode||t.parentNode.removeChild(t)}}}},848(t){t.exports=function(t,e){if(e.styleSheet)e.styleSheet.cssText=t;else{for(;e.firstChild;)e.removeChild(e.firstChild);e.appendChild(document.createTextNode(t))}}},579(t,e,r){var n=r(647),o=r.n(n),a=r(564),i=r.n(a),s=r(648),p=r.n(s),c=r(279),l=r.n(c),d=r(115),u=r.n(d),b=r(848),f=r.n(b),m=r(160),v={};v.styleTagTransform=f(),v.setAttributes=l(),v.insert=p().bind(null,"head"),v.domAPI=i(),v.insertStyleElement=u(),o()(m.A,v),m.A&&m.A.locals&&m.A.locals}}]);